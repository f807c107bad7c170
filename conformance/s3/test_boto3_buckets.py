"""Bucket operations through boto3: ListBuckets, Create/Delete/HeadBucket,
GetBucketLocation, and the errors around them."""

import pytest
from botocore.exceptions import ClientError

import s3util
from s3util import error_code, http_status


def test_create_head_list_delete(s3):
    name = s3util.unique_bucket("b")
    s3.create_bucket(Bucket=name)
    try:
        assert http_status_of(s3.head_bucket(Bucket=name)) == 200
        names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
        assert name in names
        for b in s3.list_buckets()["Buckets"]:
            assert b["CreationDate"] is not None
    finally:
        s3.delete_bucket(Bucket=name)
    with pytest.raises(ClientError) as e:
        s3.head_bucket(Bucket=name)
    assert http_status(e.value) == 404
    assert name not in [b["Name"] for b in s3.list_buckets()["Buckets"]]


def http_status_of(resp):
    return resp["ResponseMetadata"]["HTTPStatusCode"]


def test_get_bucket_location(s3, bucket):
    loc = s3.get_bucket_location(Bucket=bucket)
    # us-east-1 is reported as an empty (None) LocationConstraint.
    assert loc.get("LocationConstraint") in (None, "", s3util.REGION)


def test_create_existing_bucket(s3, bucket):
    # In us-east-1 AWS answers 200 (a no-op) to re-creating a bucket one owns;
    # elsewhere 409 BucketAlreadyOwnedByYou. Either is accepted; the bucket must
    # survive with its contents.
    s3.put_object(Bucket=bucket, Key="keep", Body=b"x")
    try:
        s3.create_bucket(Bucket=bucket)
    except ClientError as e:
        assert error_code(e) in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists")
        assert http_status(e) == 409
    assert s3.get_object(Bucket=bucket, Key="keep")["Body"].read() == b"x"


def test_delete_missing_bucket(s3):
    with pytest.raises(ClientError) as e:
        s3.delete_bucket(Bucket=s3util.unique_bucket("missing"))
    assert error_code(e.value) == "NoSuchBucket"
    assert http_status(e.value) == 404


def test_delete_non_empty_bucket(s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    with pytest.raises(ClientError) as e:
        s3.delete_bucket(Bucket=bucket)
    assert error_code(e.value) == "BucketNotEmpty"
    assert http_status(e.value) == 409


def test_object_ops_on_missing_bucket(s3):
    name = s3util.unique_bucket("missing")
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=name, Key="k", Body=b"x")
    assert error_code(e.value) == "NoSuchBucket"
    with pytest.raises(ClientError) as e:
        s3.list_objects_v2(Bucket=name)
    assert error_code(e.value) == "NoSuchBucket"


@pytest.mark.moto_gap
def test_invalid_bucket_name(raw):
    # Upper case and underscores are not valid bucket names.
    status, _, body = raw.request("PUT", "/Bad_Bucket_Name")
    assert status == 400, body
    assert b"InvalidBucketName" in body

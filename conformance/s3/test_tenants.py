"""Two tenants (issue 19): what one tenant's key may do to another tenant's
bucket, end to end with boto3 — nothing by default, what the owner's bucket
policy grants (to the tenant or to one of its users), and an explicit Deny
winning over a public ACL.

Needs the second tenant `deploy/s3-conformance.sh` makes with `fskv admin
tenant create` / `user create` (S3_TENANT2_*); a gateway-only test (moto
has one account). A changed policy reaches other gateway processes within
2 s (ACCESS_CACHE_TTL_MS), so checks that follow a change poll for up to 4 s.
"""

import os
import time
import uuid

import pytest
from botocore import UNSIGNED
from botocore.exceptions import ClientError

import s3util
from s3util import error_code, http_status

TENANT2 = os.environ.get("S3_TENANT2_NAME", "")
USER2 = os.environ.get("S3_TENANT2_USER", "")
pytestmark = [
    pytest.mark.fs_only,
    pytest.mark.skipif(not TENANT2, reason="S3_TENANT2_NAME not set (deploy/s3-conformance.sh makes a second tenant)"),
]


@pytest.fixture(scope="module")
def other():
    ak, sk = os.environ.get("S3_TENANT2_ACCESS_KEY", ""), os.environ.get("S3_TENANT2_SECRET_KEY", "")
    assert ak and sk, "the second tenant's user was not made (see the s3-conformance log)"
    url = s3util.endpoint()
    import boto3
    from botocore.config import Config
    return boto3.client("s3", endpoint_url=url, aws_access_key_id=ak, aws_secret_access_key=sk,
                        config=Config(region_name="us-east-1", signature_version="s3v4", s3={"addressing_style": "path"},
                                      retries={"max_attempts": 1, "mode": "standard"}))


def outcome(fn):
    try:
        fn()
        return (200, None)
    except ClientError as e:
        return (http_status(e), error_code(e))


def eventually(fn, want, within_s=4.0):
    t0 = time.monotonic()
    while True:
        got = outcome(fn)
        if got[0] == want or time.monotonic() - t0 > within_s:
            return got
        time.sleep(0.1)


def policy(bucket, statements):
    import json
    return json.dumps({"Version": "2012-10-17", "Statement": statements})


def test_another_tenant_sees_and_touches_nothing_by_default(s3, other, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"mine")
    names = [b["Name"] for b in other.list_buckets().get("Buckets", [])]
    assert bucket not in names
    for fn in (lambda: other.get_object(Bucket=bucket, Key="k"),
               lambda: other.put_object(Bucket=bucket, Key="k2", Body=b"x"),
               lambda: other.list_objects_v2(Bucket=bucket),
               lambda: other.delete_object(Bucket=bucket, Key="k"),
               lambda: other.get_bucket_policy(Bucket=bucket)):
        assert outcome(fn) == (403, "AccessDenied")
    # The name is taken across tenants.
    assert outcome(lambda: other.create_bucket(Bucket=bucket)) == (409, "BucketAlreadyExists")
    # And the other tenant's own bucket is its own.
    theirs = s3util.unique_bucket("t2")
    other.create_bucket(Bucket=theirs)
    try:
        other.put_object(Bucket=theirs, Key="x", Body=b"theirs")
        assert other.get_object(Bucket=theirs, Key="x")["Body"].read() == b"theirs"
        assert outcome(lambda: s3.get_object(Bucket=theirs, Key="x"))[0] == 403
    finally:
        s3util.empty_and_delete(other, theirs)


def test_a_bucket_policy_grants_a_tenant_and_a_user(s3, other, bucket):
    s3.put_object(Bucket=bucket, Key="shared/doc", Body=b"for the other tenant")
    s3.put_bucket_policy(Bucket=bucket, Policy=policy(bucket, [
        {"Sid": "read", "Effect": "Allow", "Principal": {"AWS": f"arn:aws:iam::{TENANT2}:root"},
         "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{bucket}/shared/*"},
        {"Sid": "drop", "Effect": "Allow", "Principal": {"AWS": f"arn:aws:iam::{TENANT2}:user/{USER2}"},
         "Action": "s3:PutObject", "Resource": f"arn:aws:s3:::{bucket}/inbox/*"},
    ]))
    assert eventually(lambda: other.get_object(Bucket=bucket, Key="shared/doc"), 200)[0] == 200
    assert other.get_object(Bucket=bucket, Key="shared/doc")["Body"].read() == b"for the other tenant"
    # Only what the statements name.
    assert outcome(lambda: other.put_object(Bucket=bucket, Key="shared/doc", Body=b"no"))[0] == 403
    assert outcome(lambda: other.list_objects_v2(Bucket=bucket))[0] == 403
    other.put_object(Bucket=bucket, Key="inbox/report", Body=b"dropped")
    # What the other tenant wrote belongs to the bucket: its owner reads it.
    assert s3.get_object(Bucket=bucket, Key="inbox/report")["Body"].read() == b"dropped"
    # The grant goes with the policy.
    s3.delete_bucket_policy(Bucket=bucket)
    assert eventually(lambda: other.get_object(Bucket=bucket, Key="shared/doc"), 403)[0] == 403


def test_an_explicit_deny_beats_a_public_acl(s3, other, bucket):
    s3.put_object(Bucket=bucket, Key="pub", Body=b"public")
    s3.put_bucket_acl(Bucket=bucket, ACL="public-read")
    s3.put_object_acl(Bucket=bucket, Key="pub", ACL="public-read")
    anon = s3util.make_client(signature_version=UNSIGNED)
    assert eventually(lambda: other.get_object(Bucket=bucket, Key="pub"), 200)[0] == 200
    s3.put_bucket_policy(Bucket=bucket, Policy=policy(bucket, [
        {"Sid": "no", "Effect": "Deny", "Principal": {"AWS": TENANT2},
         "Action": "s3:*", "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]},
    ]))
    assert eventually(lambda: other.get_object(Bucket=bucket, Key="pub"), 403) == (403, "AccessDenied")
    # Everyone else still reads it: the ACL stands, the Deny names one tenant.
    assert anon.get_object(Bucket=bucket, Key="pub")["Body"].read() == b"public"
    assert s3.get_object(Bucket=bucket, Key="pub")["Body"].read() == b"public"
    s3.delete_bucket_policy(Bucket=bucket)
    s3.put_bucket_acl(Bucket=bucket, ACL="private")


def test_unique_names_do_not_leak_across_tenants(other):
    # A bucket that does not exist: 404 for everyone, no hint of tenants.
    name = f"conf-none-{uuid.uuid4().hex[:12]}"
    assert outcome(lambda: other.head_bucket(Bucket=name))[0] == 404

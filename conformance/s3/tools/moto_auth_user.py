"""On a moto server started with INITIAL_NO_AUTH_ACTION_COUNT=3, make a user
with an s3:* policy and an access key (the 3 unauthenticated requests), and
print "ACCESS_KEY SECRET_KEY"."""
import json
import sys

import boto3

iam = boto3.client("iam", endpoint_url=sys.argv[1], region_name="us-east-1",
                   aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
iam.create_user(UserName="conformance")
iam.put_user_policy(UserName="conformance", PolicyName="s3-all", PolicyDocument=json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
k = iam.create_access_key(UserName="conformance")["AccessKey"]
print(k["AccessKeyId"], k["SecretAccessKey"])

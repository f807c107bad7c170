import json
import os

import pytest

from mqclient import MqClient


def _endpoints():
    path = os.environ.get("MQ_ENDPOINTS")
    if not path:
        pytest.skip("SKIPPED: MQ_ENDPOINTS (a fskv up endpoints.json) is not set", allow_module_level=True)
    with open(path) as f:
        return json.load(f)


@pytest.fixture(scope="session")
def endpoints():
    return _endpoints()


@pytest.fixture(scope="session")
def mq(endpoints):
    return MqClient(endpoints["mq"], endpoints["access_key"], endpoints["secret_key"])


@pytest.fixture(scope="session")
def mq_reader(endpoints):
    return MqClient(endpoints["mq_reader"], endpoints["access_key"], endpoints["secret_key"])

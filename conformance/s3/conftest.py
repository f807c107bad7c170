import os
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import s3util  # noqa: E402

BIN = os.path.dirname(sys.executable)


def pytest_configure(config):
    if "S3_ENDPOINT" not in os.environ:
        raise pytest.UsageError("S3_ENDPOINT is not set (use run.sh)")
    s3util.check_loopback(os.environ["S3_ENDPOINT"])


def pytest_collection_modifyitems(config, items):
    kind = s3util.target_kind()
    on_moto = kind in ("moto", "moto-auth")
    skip_fs = pytest.mark.skip(reason="filesystem-backed semantics (ours only); target is moto")
    skip_gap = pytest.mark.skip(reason="not implemented by the moto reference; required of the gateway")
    skip_reader = pytest.mark.skip(reason="S3_READER_ENDPOINT not set")
    for item in items:
        if on_moto and "fs_only" in item.keywords:
            item.add_marker(skip_fs)
        if on_moto and "moto_gap" in item.keywords and not (
                kind == "moto-auth" and "auth_proof" in item.keywords):
            item.add_marker(skip_gap)
        if "reader" in item.keywords and not os.environ.get("S3_READER_ENDPOINT"):
            item.add_marker(skip_reader)


@pytest.fixture(scope="session")
def s3():
    return s3util.make_client()


@pytest.fixture
def bucket(s3):
    """A fresh bucket with a unique name, emptied and deleted afterwards."""
    name = s3util.unique_bucket()
    s3.create_bucket(Bucket=name)
    yield name
    s3util.empty_and_delete(s3, name)


@pytest.fixture
def raw():
    return s3util.Raw()


def tool(name):
    p = os.path.join(BIN, name)
    if os.path.exists(p):
        return p
    found = shutil.which(name)
    if not found:
        pytest.skip(f"{name} not installed")
    return found


@pytest.fixture(scope="session")
def cli_env(tmp_path_factory):
    """Environment for the command-line clients: credentials, region, a
    path-style awscli config, an rclone remote named 'conf' and an s3cmd config."""
    d = tmp_path_factory.mktemp("clicfg")
    ep = s3util.endpoint()
    hostport = ep.split("://", 1)[1].rstrip("/")
    awscfg = d / "aws_config"
    awscfg.write_text(
        "[default]\n"
        f"region = {s3util.REGION}\n"
        "s3 =\n    addressing_style = path\n    signature_version = s3v4\n"
        "retry_mode = standard\nmax_attempts = 1\n")
    s3cfg = d / "s3cfg"
    s3cfg.write_text(
        "[default]\n"
        f"access_key = {s3util.access_key()}\n"
        f"secret_key = {s3util.secret_key()}\n"
        f"host_base = {hostport}\n"
        f"host_bucket = {hostport}\n"
        f"bucket_location = {s3util.REGION}\n"
        "use_https = False\nsignature_v2 = False\ncheck_ssl_certificate = False\n"
        "multipart_chunk_size_mb = 5\nprogress_meter = False\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RCLONE_"))}
    env.update({
        "AWS_ACCESS_KEY_ID": s3util.access_key(),
        "AWS_SECRET_ACCESS_KEY": s3util.secret_key(),
        "AWS_DEFAULT_REGION": s3util.REGION,
        "AWS_REGION": s3util.REGION,
        "AWS_CONFIG_FILE": str(awscfg),
        "AWS_SHARED_CREDENTIALS_FILE": str(d / "nonexistent"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "RCLONE_CONFIG": str(d / "rclone.conf"),
        "RCLONE_CONFIG_CONF_TYPE": "s3",
        "RCLONE_CONFIG_CONF_PROVIDER": "Other",
        "RCLONE_CONFIG_CONF_ACCESS_KEY_ID": s3util.access_key(),
        "RCLONE_CONFIG_CONF_SECRET_ACCESS_KEY": s3util.secret_key(),
        "RCLONE_CONFIG_CONF_ENDPOINT": ep,
        "RCLONE_CONFIG_CONF_REGION": s3util.REGION,
        "RCLONE_CONFIG_CONF_FORCE_PATH_STYLE": "true",
        "S3CMD_CONFIG": str(s3cfg),
        "PATH": BIN + os.pathsep + os.environ.get("PATH", ""),
    })
    (d / "rclone.conf").write_text("")
    env["_S3CFG"] = str(s3cfg)
    return env


def run_cli(env, args, check=True, timeout=120, input=None):
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout,
                       input=input)
    if check and r.returncode != 0:
        # The tool's last words on the first line: a summary that keeps one
        # line of a failure still says why.
        why = next((ln.strip() for ln in reversed(r.stderr.splitlines()) if ln.strip()), "")[:400]
        raise AssertionError(f"{args!r} exited {r.returncode}: {why}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
    return r

"""Starts real `sluice serve` processes with the real model on 127.0.0.1:0 for the tests."""

import json
import os
import pathlib
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"


def binary():
    return os.environ.get("SLUICE_BIN", str(ROOT / "target" / "debug" / "sluice"))


class Server:
    """One `sluice serve` process; `url` is its base URL."""

    def __init__(self, *args, env=None):
        model_dir = os.environ.get("SLUICE_MODEL_DIR", str(ROOT / "models" / "cache"))
        cmd = [binary(), "serve", "--port", "0", "--model-dir", model_dir, *args]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL if not os.environ.get("SLUICE_TEST_LOGS") else None,
            text=True,
            env={**os.environ, **(env or {})},
        )
        line = self.proc.stdout.readline()
        assert line.startswith("sluice listening on "), f"unexpected first line: {line!r}"
        self.url = line.split()[-1]
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(self.url + "/ready", timeout=5) as r:
                    if r.status == 200:
                        break
            except urllib.error.HTTPError as e:
                assert e.code == 503, e
            except urllib.error.URLError:
                pass
            assert self.proc.poll() is None, "the server exited while loading"
            assert time.time() < deadline, "the server did not become ready"
            time.sleep(0.05)

    def stop(self):
        """SIGTERM, then the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


def raw(url, path, body=None, headers=None, method=None):
    """A request without the openai client: (status, headers, parsed JSON or text)."""
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method)
    req.add_header("content-type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            status, hdrs, text = r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        status, hdrs, text = e.code, dict(e.headers), e.read().decode()
    try:
        return status, hdrs, json.loads(text)
    except ValueError:
        return status, hdrs, text


def series(text, name):
    """The value of the one sample named `name` (labels aside) in a Prometheus text page."""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(name + "{") or line.startswith(name + " ")]
    assert len(values) == 1, (name, values)
    return values[0]


def assert_error_shape(body, status=None):
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str), err
    assert "param" in err and "code" in err, err
    for leak in ("/root", "/work", "panicked", "src/", ".rs:"):
        assert leak not in err["message"], err


@pytest.fixture(scope="session")
def server():
    s = Server("--max-model-len", "2048")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="session")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)

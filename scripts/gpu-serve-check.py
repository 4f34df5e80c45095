#!/usr/bin/env python3
"""The serving half of `make check-gpu`: `sluice serve` on the device, end to end over HTTP.

It starts the binary on a model with `--device`, waits for `/ready`, then checks what a GPU
replica must show and prints one JSON object:
  - start-up seconds, and the KV pool the log reports (blocks, block size, free memory and the
    share taken by `--gpu-memory-utilization`);
  - `vllm:cache_config_info` on `/metrics` (labels `num_gpu_blocks`, `block_size`);
  - one greedy chat completion (status, usage, latency), one streamed (time to first chunk,
    chunks), and `--concurrent` greedy completions at once (all 200, aggregate output tok/s);
    then as many at temperature 1 alone, OpenAI's default (`concurrent_temperature`: drawn on
    the device, two small copies a step), and at temperature 1, top-p 0.95
    (`concurrent_sampled`: drawn on the host from the device's top 64 with the row's mass, or
    from the whole row where those do not hold the nucleus), and at temperature 1 with
    frequency and presence penalties (`concurrent_penalised`: the penalties made on the
    device, then drawn there): the differences are what each way of drawing costs per step.

Standard library only: the GPU machine has Python but nothing can be installed there.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request


def request(url, body=None, timeout=120):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_ready(base, proc, limit):
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if proc.poll() is not None:
            raise RuntimeError(f"sluice exited with {proc.returncode} before it was ready")
        try:
            status, _ = request(base + "/ready", timeout=2)
            if status == 200:
                return time.monotonic() - started
        except OSError:  # not listening yet
            pass
        time.sleep(0.25)
    raise RuntimeError(f"sluice not ready after {limit} s")


GREEDY = {"temperature": 0}
TEMPERATURE = {"temperature": 1.0, "seed": 7}
SAMPLED = {"temperature": 1.0, "top_p": 0.95, "seed": 7}
PENALISED = {"temperature": 1.0, "seed": 7, "frequency_penalty": 0.5, "presence_penalty": 0.3}


def chat(base, model, content, max_tokens, sampling=GREEDY):
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        **sampling,
    }
    started = time.monotonic()
    status, raw = request(base + "/v1/chat/completions", body)
    elapsed = time.monotonic() - started
    doc = json.loads(raw) if raw else {}
    return status, doc, elapsed


def stream(base, model, max_tokens):
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Count to twenty."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = urllib.request.Request(
        base + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    started = time.monotonic()
    first, chunks, usage, errors = None, 0, None, []
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            doc = json.loads(payload)
            if "error" in doc:
                errors.append(doc["error"])
            if doc.get("choices"):
                chunks += 1
                if first is None:
                    first = time.monotonic() - started
            if doc.get("usage"):
                usage = doc["usage"]
    return {
        "first_chunk_s": first,
        "chunks": chunks,
        "usage": usage,
        "errors": errors,
        "seconds": time.monotonic() - started,
    }


def concurrent(base, model, n, max_tokens, sampling=GREEDY):
    results = [None] * n

    def one(i):
        try:
            prompt = f"Write a short poem about the number {i}."
            results[i] = chat(base, model, prompt, max_tokens, sampling)
        except Exception as e:  # noqa: BLE001 - reported, not raised
            results[i] = (0, {"error": str(e)}, 0.0)

    started = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    ok = [r for r in results if r[0] == 200]
    tokens = sum(r[1].get("usage", {}).get("completion_tokens", 0) for r in ok)
    return {
        "requests": n,
        "ok": len(ok),
        "statuses": sorted({r[0] for r in results}),
        "completion_tokens": tokens,
        "output_tok_s": tokens / wall if wall else None,
        "wall_s": wall,
    }


def cache_config(metrics_text):
    for line in metrics_text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            return dict(re.findall(r'(\w+)="([^"]*)"', line))
    return None


def kv_log(log_text):
    """The start-up lines that size and allocate the KV pool, as the log printed them."""
    keep = ("KV pool", "free_mib", "num_blocks", "model loaded")
    plain = re.sub(r"\x1b\[[0-9;]*m", "", log_text)
    return [l.strip()[-400:] for l in plain.splitlines() if any(k in l for k in keep)][:6]


def graph_log(log_text):
    """What the replica logged about CUDA graphs (SLUICE_CUDA_GRAPHS=1): buckets captured, or
    why capturing failed."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", log_text)
    return [l.strip()[-400:] for l in plain.splitlines() if "CUDA graph" in l][:20]


CONCURRENT_KINDS = (
    "concurrent",
    "concurrent_temperature",
    "concurrent_sampled",
    "concurrent_penalised",
)


def failures(out):
    """What a GPU replica got wrong, in words: any answer that was not a full 200."""
    failed = []
    if out["chat"]["status"] != 200:
        failed.append(f"chat answered {out['chat']['status']}: {out['chat']['error']}")
    if out["stream"]["errors"] or not out["stream"]["usage"]:
        failed.append(f"the stream broke: {out['stream']['errors']}")
    for name in CONCURRENT_KINDS:
        if out[name]["ok"] != out[name]["requests"]:
            failed.append(f"{name} statuses {out[name]['statuses']}")
    if not out["cache_config_info"]:
        failed.append("no vllm:cache_config_info on /metrics")
    return failed


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--backend", default=None)
    ap.add_argument("--port", type=int, default=18080)
    ap.add_argument("--ready-timeout", type=float, default=180)
    ap.add_argument("--concurrent", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--extra", default="", help="more `serve` flags, space-separated")
    args = ap.parse_args()

    base = f"http://127.0.0.1:{args.port}"
    cmd = [args.bin, "serve", "--host", "127.0.0.1", "--port", str(args.port),
           "--model", args.model, "--device", args.device]
    if args.backend:
        cmd += ["--backend", args.backend]
    cmd += args.extra.split()
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "info"))
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    out = {"mode": "serve", "command": " ".join(cmd)}
    try:
        out["ready_s"] = wait_ready(base, proc, args.ready_timeout)
        _, raw = request(base + "/v1/models")
        model = json.loads(raw)["data"][0]["id"]
        out["model_id"] = model
        status, doc, elapsed = chat(base, model, "What is the capital of France?", args.max_tokens)
        out["chat"] = {
            "status": status,
            "seconds": elapsed,
            "usage": doc.get("usage"),
            "finish_reason": (doc.get("choices") or [{}])[0].get("finish_reason"),
            "text": ((doc.get("choices") or [{}])[0].get("message") or {}).get("content"),
            "error": doc.get("error"),
        }
        out["stream"] = stream(base, model, args.max_tokens)
        out["concurrent"] = concurrent(base, model, args.concurrent, args.max_tokens)
        out["concurrent_temperature"] = concurrent(
            base, model, args.concurrent, args.max_tokens, TEMPERATURE
        )
        out["concurrent_sampled"] = concurrent(
            base, model, args.concurrent, args.max_tokens, SAMPLED
        )
        out["concurrent_penalised"] = concurrent(
            base, model, args.concurrent, args.max_tokens, PENALISED
        )
        _, raw = request(base + "/metrics")
        out["cache_config_info"] = cache_config(raw.decode(errors="replace"))
        failed = failures(out)
        if failed:
            out["error"] = "; ".join(failed)
    except Exception as e:  # noqa: BLE001 - the JSON carries the failure
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.seek(0)
        text = log.read()
        out["kv_log"] = kv_log(text)
        out["cuda_graph_log"] = graph_log(text)
        if "error" in out:
            out["log_tail"] = re.sub(r"\x1b\[[0-9;]*m", "", text)[-3000:]
    print(json.dumps(out))
    return 1 if "error" in out else 0


if __name__ == "__main__":
    sys.exit(main())

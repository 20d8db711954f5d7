"""HTTP service: in-process TestClient for every 4xx case, a real uvicorn process, concurrency, fuzzing."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import linker
import linker.precision
from linker.errors import ConfigError
from linker.link import Linker
from linker.service import DOCS_FILES_URL, ServiceLimits, create_app

from fixtures.normalize.normalize_tables import build_indexes  # tiny MedDRA-like and HPO-like concept tables

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def indexes(tmp_path_factory) -> dict[str, Path]:
    return build_indexes(tmp_path_factory.mktemp("indexes"))


@pytest.fixture(scope="module")
def client(indexes):
    # Small limits so that the limit cases stay cheap; the defaults are tested separately.
    app = create_app([indexes["meddra"], indexes["hpo"]], ServiceLimits(max_text_chars=40, max_mentions=3, max_k=10))
    with TestClient(app) as c:
        yield c


def test_health_and_indexes(client, indexes):
    assert client.get("/health").json() == {"status": "ok", "version": linker.__version__,
                                            "indexes": ["meddra", "hpo"]}
    body = client.get("/indexes").json()
    assert body["default"] == "meddra"
    assert [(i["name"], i["languages"], i["manifest"]["kind"]) for i in body["indexes"]] == [
        ("meddra", ["en", "es"], "tfidf"), ("hpo", ["en"], "tfidf"),
    ]
    assert body["indexes"][0]["version"] == Linker.load(indexes["meddra"]).version
    # Names and manifests, but none of the server's paths (the build machine's concept table, its folders).
    assert str(indexes["meddra"].parent) not in json.dumps(body)
    assert body["indexes"][0]["manifest"]["concepts"]["source_path"].endswith(".parquet")


def test_link_ranked_concepts_with_version(client, indexes):
    response = client.post("/link", json={"mentions": [{"text": "hair loss", "id": "m1"}, {"text": "náuseas",
                                                                                             "lang": "es", "id": 7}],
                                          "k": 2})
    assert response.status_code == 200
    body = response.json()
    assert (body["index"], body["k"], body["version"]) == ("meddra", 2, Linker.load(indexes["meddra"]).version)
    first, second = body["results"]
    assert (first["id"], first["text"]) == ("m1", "hair loss") and "lang" not in first
    assert [c["concept_id"] for c in first["candidates"]] == ["10001760", "10019211"]
    top = first["candidates"][0]
    assert (top["preferred_name"], top["matched_name"], top["score"], top["term_type"], top["term_id"]) == (
        "Alopecia", "Hair loss", 1.0, "LLT", "10019045")
    assert top["hierarchy"][0]["soc_name"] == "Skin and subcutaneous tissue disorders"
    assert (second["id"], second["lang"], second["candidates"][0]["preferred_name"]) == (7, "es", "Náuseas")


def test_link_other_index_default_k(client):
    body = client.post("/link", json={"mentions": [{"text": "Dizziness"}], "index": "hpo"}).json()
    assert body["index"] == "hpo" and body["k"] == 5
    assert body["results"][0]["candidates"][0]["concept_id"] == "HP:0002321"
    assert "hierarchy" not in body["results"][0]["candidates"][0]


def _page_urls(html: str) -> list[str]:
    return re.findall(r"""(?:src|href)=["']([^"']+)["']|url: ?'([^']+)'""", html)


def test_openapi_docs_load_every_file_from_the_service_itself(client):
    """Swagger UI's page works offline: every file it loads is served by the app (fastapi-offline's copies),
    none comes from a CDN, and the OpenAPI schema it shows is the app's own."""
    response = client.get("/docs")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    urls = [url for pair in _page_urls(response.text) for url in pair if url]
    assert {url.rsplit("/", 1)[-1] for url in urls} == {"swagger-ui.css", "swagger-ui-bundle.js", "favicon.png",
                                                        "openapi.json"}
    for url in urls:
        assert url.startswith("/") and not url.startswith("//"), url  # this server, never another host
        file = client.get(url)
        assert file.status_code == 200 and len(file.content) > 1000, url
    assert "SwaggerUIBundle" in client.get(f"{DOCS_FILES_URL}/swagger-ui-bundle.js").text
    spec = client.get("/openapi.json").json()
    assert {"/link", "/health", "/indexes"} <= set(spec["paths"])
    assert client.get("/redoc").status_code == 404  # FastAPI's other docs page loads from a CDN: not served


def test_docs_without_swagger_files_say_what_to_install(indexes, monkeypatch):
    monkeypatch.setattr("linker.service.swagger_files", lambda: None)
    with TestClient(create_app([indexes["hpo"]])) as c:
        page = c.get("/docs")
    assert page.status_code == 200 and "pip install 'linker[service]'" in page.text
    assert [url for pair in _page_urls(page.text) for url in pair if url] == ["/openapi.json"]


M = [{"text": "nausea"}]
BAD_REQUESTS = [
    # (body, status, field, substring of the error)
    ({}, 422, "mentions", "mentions: Field required"),
    ({"mentions": "nausea"}, 422, "mentions", "valid list"),
    ({"mentions": []}, 422, "mentions", "expected at least one mention"),
    ({"mentions": M * 4}, 413, "mentions", "expected at most 3 mentions, found more than 3"),  # counted before parsing
    ({"mentions": [{"text": 5}]}, 422, "mentions[0].text", "valid string"),
    ({"mentions": [{"lang": "en"}]}, 422, "mentions[0].text", "Field required"),
    ({"mentions": [{"text": "nausea"}, {"text": ""}]}, 422, "mentions[1].text", "expected a non-empty text"),
    ({"mentions": [{"text": " \t\n"}]}, 422, "mentions[0].text", "expected a non-empty text"),
    ({"mentions": [{"text": "x" * 41}]}, 422, "mentions[0].text", "expected at most 40 characters, found 41"),
    ({"mentions": [{"text": "nausea", "lang": "xx"}]}, 422, "mentions[0].lang", "(en, es), found 'xx'"),
    ({"mentions": [{"text": "nausea", "lang": 1}]}, 422, "mentions[0].lang", "valid string"),
    ({"mentions": [{"text": "nausea", "id": [1]}]}, 422, "mentions[0].id", ""),
    ({"mentions": [{"text": "nausea", "txt": "x"}]}, 422, "mentions[0].txt", "Extra inputs are not permitted"),
    ({"mentions": M, "k": 0}, 422, "k", "expected an integer from 1 to 10, found 0"),
    ({"mentions": M, "k": 11}, 422, "k", "expected an integer from 1 to 10, found 11"),
    ({"mentions": M, "k": "5"}, 422, "k", "valid integer"),
    ({"mentions": M, "k": 2.5}, 422, "k", "valid integer"),
    ({"mentions": M, "k": True}, 422, "k", "valid integer"),
    ({"mentions": M, "index": "umls"}, 422, "index", "expected one of meddra, hpo, found 'umls'"),
    ([{"text": "nausea"}], 422, "body", 'expected a JSON object such as {"mentions": [{"text": "hair loss"}]}, found an array'),
    ("nausea", 422, "body", "valid dictionary"),
]


@pytest.mark.parametrize(("body", "status", "field", "message"), BAD_REQUESTS)
def test_bad_requests_are_4xx_naming_the_field(client, body, status, field, message):
    response = client.post("/link", json=body)
    assert response.status_code == status, response.text
    error = response.json()
    assert error["field"] == field
    assert message in error["error"]


def test_invalid_json_and_oversized_body(client):
    response = client.post("/link", content=b'{"mentions": [', headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"].startswith("body: expected JSON, found invalid JSON")
    # Python's JSON parser accepts NaN and Infinity; they must still be a clean 4xx.
    for raw in (b'{"mentions": [{"text": "a", "id": NaN}]}', b'{"mentions": [{"text": "a"}], "k": Infinity}'):
        response = client.post("/link", content=raw, headers={"content-type": "application/json"})
        assert response.status_code == 422, response.text
    big = json.dumps({"mentions": [{"text": "x" * (5 * 1024 * 1024)}]})
    response = client.post("/link", content=big, headers={"content-type": "application/json"})
    assert response.status_code == 413 and "expected at most 4194304 bytes" in response.json()["error"]


def test_linker_error_becomes_422(indexes, monkeypatch):
    app = create_app([indexes["hpo"]])
    hpo = app.state.indexes["hpo"].linker

    def broken(*_args, **_kwargs):
        raise ConfigError("index cannot answer this")

    monkeypatch.setattr(hpo, "link", broken)
    with TestClient(app) as c:
        response = c.post("/link", json={"mentions": M})
    assert response.status_code == 422 and response.json() == {"error": "index cannot answer this", "field": None}


def test_default_limits_and_bad_start_up(indexes):
    limits = ServiceLimits()
    assert (limits.max_text_chars, limits.max_mentions, limits.max_k, limits.default_k) == (500, 1000, 100, 5)
    with TestClient(create_app([indexes["hpo"]])) as c:
        assert c.post("/link", json={"mentions": [{"text": "a" * 500}], "k": 100}).status_code == 200
        too_long = c.post("/link", json={"mentions": [{"text": "a" * 501}]})
        assert (too_long.status_code, too_long.json()["field"]) == (422, "mentions[0].text")
        too_many = c.post("/link", json={"mentions": [{"text": "a"}] * 1001})
        assert (too_many.status_code, too_many.json()["field"]) == (413, "mentions")
        assert c.post("/link", json={"mentions": M, "k": 101}).json()["field"] == "k"
    with pytest.raises(ConfigError, match="two indexes named 'hpo'"):
        create_app([indexes["hpo"], indexes["hpo"]])
    with pytest.raises(ConfigError, match="no index given"):
        create_app([])
    with pytest.raises(ConfigError, match="max_k"):
        ServiceLimits(max_k=0)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=50),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["mentions", "text", "lang", "id", "k", "index", "x"]) | st.text(max_size=5), children,
        max_size=4),
    max_leaves=12,
)
MENTION = st.fixed_dictionaries({"text": st.text(max_size=60) | JSON},
                                optional={"lang": st.sampled_from(["en", "es", "xx", ""]) | JSON, "id": JSON})
REQUEST = st.fixed_dictionaries({"mentions": st.lists(MENTION, max_size=5) | JSON},
                                optional={"k": st.integers(-3, 15) | JSON, "index": st.sampled_from(["hpo", "meddra", "?"])})


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=REQUEST | JSON)
def test_fuzz_request_bodies_never_5xx(client, body):
    response = client.post("/link", json=body)
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        assert isinstance(response.json()["error"], str)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200))
def test_fuzz_raw_bytes_never_5xx(client, raw):
    response = client.post("/link", content=raw, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500


# ----------------------------------------------------------------------------- a real server process


@pytest.fixture(scope="module")
def server(indexes, serve):
    with serve("--index", indexes["meddra"], "--index", indexes["hpo"], "--max-mentions", "3", "--max-text-chars", "40",
               "--max-k", "10") as running:
        yield running.base


@pytest.mark.slow
def test_real_server_endpoints_and_every_4xx(server):
    with httpx.Client(base_url=server, timeout=10) as http:
        assert http.get("/health").json()["indexes"] == ["meddra", "hpo"]
        docs = http.get("/docs")
        assert docs.status_code == 200
        for url in [url for pair in _page_urls(docs.text) for url in pair if url]:
            assert url.startswith("/") and http.get(url).status_code == 200, url
        body = http.post("/link", json={"mentions": [{"text": "Itching"}], "k": 1}).json()
        assert [c["concept_id"] for c in body["results"][0]["candidates"]] == ["10037087"]
        for request, status, field, message in BAD_REQUESTS:
            response = http.post("/link", json=request)
            assert (response.status_code, response.json()["field"]) == (status, field), request
            assert message in response.json()["error"]
        response = http.post("/link", content=b"{", headers={"content-type": "application/json"})
        assert response.status_code == 400


@pytest.mark.slow
def test_real_server_concurrent_requests_agree_with_sequential(server):
    texts = ["hair loss", "head pain", "nausea", "Itching", "dizziness", "alopecia", "náuseas", "headache"]
    requests = [{"mentions": [{"text": t, "id": i}], "k": 3} for i, t in enumerate(texts * 6)]
    with httpx.Client(base_url=server, timeout=30) as http:
        sequential = [http.post("/link", json=r).json()["results"] for r in requests[: len(texts)]]
        with ThreadPoolExecutor(max_workers=12) as pool:
            responses = list(pool.map(lambda r: http.post("/link", json=r), requests))
    assert [r.status_code for r in responses] == [200] * len(requests)
    for i, response in enumerate(responses):
        [result] = response.json()["results"]
        assert result["id"] == i
        assert result["candidates"] == sequential[i % len(texts)][0]["candidates"]


@pytest.mark.slow
def test_serve_refuses_a_missing_index(tmp_path):
    result = subprocess.run([sys.executable, "-m", "linker", "serve", "--index", str(tmp_path / "nope")],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {tmp_path / 'nope'}: no such index folder")


# ---- `linker serve` start-up: a bad --host/--port is one error line, not a traceback (issue 34 case 12) ----


@pytest.mark.parametrize("port", ["70000", "-1", "99999999999999999999999"])
def test_serve_refuses_a_port_out_of_range_in_one_line_before_loading_indexes(tmp_path, capsys, port):
    from linker.cli.main import main

    with pytest.raises(SystemExit) as code:  # the index does not exist: the port is checked first
        main(["serve", "--index", str(tmp_path / "nope"), "--port", port])
    assert code.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --port: expected a TCP port from 0 to 65535 (0: any free port), found {port}"]


def test_serve_refuses_a_port_in_use_in_one_line_and_serves_on_port_0(indexes, capsys, monkeypatch):
    import uvicorn

    from linker.cli.main import main

    served = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: served.append(sockets))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(SystemExit) as code:
            main(["serve", "--index", str(indexes["hpo"]), "--port", str(port)])
    assert code.value.code == 1 and not served
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"error: --host 127.0.0.1 --port {port}: expected an address this machine can listen on, "
                       "found Address already in use") and "Traceback" not in "\n".join(err)
    main(["serve", "--index", str(indexes["hpo"]), "--port", "0"])  # any free port, told in the start-up line
    [[sock]] = served
    try:
        bound = sock.getsockname()[1]
        assert bound > 0 and f"serving hpo on http://127.0.0.1:{bound} (docs at /docs)" in capsys.readouterr().err
    finally:
        sock.close()


# ---- MentionBatcher: concurrent requests share Linker.link calls, fairly, each gets its own results ----

class _RecordingLinker:
    """Stands in for a Linker: echoes each text with k and its lang, fails on the text 'boom'."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.release = threading.Event()

    def link(self, texts, *, k, langs):
        self.release.wait(5)  # hold the worker so that concurrent jobs pile up
        self.calls.append(list(texts))
        if "boom" in texts:
            raise ValueError("boom")
        return [(t, k, lang) for t, lang in zip(texts, langs, strict=True)]


def _submit(batcher, texts, k=1, langs=None):
    """Queue a job; returns an Event set when it is done and a dict that then holds the job."""
    done, box = threading.Event(), {}

    def on_done(job):
        box["job"] = job
        done.set()

    batcher.submit(texts, langs or [None] * len(texts), k, on_done)
    return done, box


def test_batcher_groups_concurrent_jobs_and_isolates_failures():
    from linker.service import MentionBatcher

    fake = _RecordingLinker()
    batcher = MentionBatcher(fake, "fake")
    jobs = [(["a"], 1, None), (["b", "c"], 1, ["es", None]), (["d"], 3, ["es"]), (["boom"], 1, None),
            (["e"], 1, None)]
    submitted = [_submit(batcher, texts, k, langs) for texts, k, langs in jobs]
    fake.release.set()
    for done, _ in submitted:
        assert done.wait(10)
    outcomes = [box["job"].results if box["job"].error is None else f"error: {box['job'].error}"
                for _, box in submitted]
    assert outcomes == [
        [("a", 1, None)], [("b", 1, "es"), ("c", 1, None)], [("d", 3, "es")], "error: boom", [("e", 1, None)],
    ]
    assert max(len(call) for call in fake.calls) > 1  # at least one call served several requests at once
    assert batcher._pending == 0


def test_batcher_interleaves_a_small_request_with_a_large_one():
    from linker.service import MentionBatcher

    fake = _RecordingLinker()
    batcher = MentionBatcher(fake, "fake")
    big = [f"big{i}" for i in range(10 * MentionBatcher.MAX_BATCH)]
    big_done, big_box = _submit(batcher, big)
    time.sleep(0.2)  # the worker is now inside its first call, on the big request alone
    small_done, _ = _submit(batcher, ["small"])
    fake.release.set()
    assert small_done.wait(10) and big_done.wait(10)
    # the small request rode in the second call, not behind the big request's 10 calls
    assert [i for i, call in enumerate(fake.calls) if "small" in call] == [1]
    assert all(len(call) <= MentionBatcher.MAX_BATCH for call in fake.calls)
    assert big_box["job"].results == [(t, 1, None) for t in big]  # every slice back in its place


def test_batcher_refuses_work_beyond_its_queue_and_the_app_answers_429(indexes):
    from linker.service import BusyError, MentionBatcher

    fake = _RecordingLinker()
    batcher = MentionBatcher(fake, "fake", max_pending=3)
    first, _ = _submit(batcher, ["a", "b"])
    with pytest.raises(BusyError, match="2 mentions are waiting"):
        _submit(batcher, ["c", "d"])
    fake.release.set()
    assert first.wait(10)
    second, _ = _submit(batcher, ["c", "d"])  # admitted again once the queue drained
    assert second.wait(10)

    app = create_app([indexes["hpo"]])
    app.state.indexes["hpo"].batcher.max_pending = 0
    with TestClient(app) as c:
        response = c.post("/link", json={"mentions": M})
    assert response.status_code == 429 and response.headers["retry-after"] == "1"
    assert response.json()["field"] == "mentions" and "queue of index hpo" in response.json()["error"]


def test_batcher_sizes_its_calls_by_the_measured_cost_per_mention():
    from linker.service import MentionBatcher

    class Slow:
        calls: list[int] = []

        def link(self, texts, *, k, langs):
            self.calls.append(len(texts))
            time.sleep(0.01 * len(texts))  # 10 ms a mention: 20 mentions make a 0.2 s call
            return list(texts)

    slow = Slow()
    batcher = MentionBatcher(slow, "slow")
    done, box = _submit(batcher, [str(i) for i in range(300)])
    assert done.wait(30) and box["job"].results == [str(i) for i in range(300)]
    assert slow.calls[0] == int(MentionBatcher.CALL_SECONDS / 0.003)  # the first guess: tf-idf's cost
    assert 10 <= slow.calls[-2] <= 30  # then about CALL_SECONDS / 10 ms


@pytest.mark.slow
def test_real_server_on_a_dense_index_answers_concurrent_requests_like_the_linker(indexes, tiny_encoder_dir, tmp_path,
                                                                                  serve):
    # The dense path of the service: encoder + FAISS on the batcher's thread, concurrent mixed-size
    # requests; every answer is 200 and equals the in-process Linker's (no 5xx, no mixed-up results).
    from linker.index import build_index
    from linker.index.dense import DenseConfig

    folder = tmp_path / "dense"
    build_index(indexes["meddra"] / "concepts.parquet", kind="dense", out=folder,
                config=DenseConfig(encoder=str(tiny_encoder_dir), precision="bf16"))
    texts = ["hair loss", "head pain", "nausea", "Itching", "dizziness", "alopecia", "náuseas", "headache", "fever"]
    expected = Linker.load(folder).link(texts, k=3)
    # torch's import alone takes minutes on a loaded CPU
    with serve("--index", folder, wait=300) as server, httpx.Client(base_url=server.base, timeout=60) as http, \
            ThreadPoolExecutor(max_workers=12) as pool:
        # sizes 1..9 from rotating offsets: every request shares the batcher's calls with others
        requests = [[(i + j) % len(texts) for j in range(1 + i % len(texts))] for i in range(36)]
        responses = list(pool.map(lambda rows: http.post(
            "/link", json={"mentions": [{"text": texts[r], "id": r} for r in rows], "k": 3}), requests))
    assert [r.status_code for r in responses] == [200] * len(requests)
    for rows, response in zip(requests, responses, strict=True):
        results = response.json()["results"]
        assert [r["id"] for r in results] == rows
        for row, result in zip(rows, results, strict=True):
            want = expected[row].candidates
            assert [c["concept_id"] for c in result["candidates"]] == [c.concept_id for c in want]
            assert [c["score"] for c in result["candidates"]] == pytest.approx([c.score for c in want], abs=1e-5)


@pytest.mark.parametrize(("given", "seen"), [
    ({}, "PASSIVE"),  # OpenMP threads sleep instead of spinning: a shared CPU (see linker/__init__.py)
    ({"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE"),  # the user's choice wins
    ({"GOMP_SPINCOUNT": "10000"}, None),  # so does a spin count of their own
])
def test_importing_linker_sets_passive_openmp_threads_unless_told(given, seen):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    code = "import os, linker, torch; print(os.environ.get('OMP_WAIT_POLICY'))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**env, **given}, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == str(seen)


# ---- POST /annotate: one limit per field, its own tagger queue (a stand-in tagger: no torch needed) ----

class _FakeExtractor:
    """Stands in for linker-ae: one positive AdverseEvent span on each 'nausea'; waits for `release`; fails on
    the text 'boom'."""

    revision = "fake-ae==1"

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.release = threading.Event()
        self.release.set()

    def extract(self, texts, *, threshold, style, lexicon=None):
        from linker.extract.model import ExtractedSpan

        self.release.wait(5)
        self.calls.append(list(texts))
        if "boom" in texts:
            raise ValueError("boom")
        return [[ExtractedSpan(at, at + 6, "nausea", "AdverseEvent", "positive", 0.9)
                 for at in (m.start() for m in re.finditer("nausea", t))] for t in texts]


def _annotating_app(indexes, limits=ServiceLimits()):
    app = create_app([indexes["meddra"]], limits)
    app.state.tagger._load = lambda fake=_FakeExtractor(): fake
    return app


def test_annotate_codes_each_text_through_the_tagger_queue_and_the_batcher(indexes):
    with TestClient(_annotating_app(indexes)) as c:
        response = c.post("/annotate", json={"texts": [{"text": "severe nausea", "id": 1}, {"text": "none"}]})
        assert c.app.state.internal_errors == 0
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["model"], [r.get("id") for r in body["results"]]) == ("fake-ae==1", [1, None])
    [span] = body["results"][0]["spans"]
    # the index has no calibration: a code whose link confidence is unknown goes to a person
    assert (span["start"], span["code"], span["decision"]) == (7, "10028813", "review")
    assert body["results"][1]["spans"] == []
    assert c.app.state.tagger._pending == 0


@pytest.mark.parametrize(("limits", "texts", "status", "message"), [
    # the scan before parsing counts `texts` against max_texts (it capped them at its generic 32 before: 422)
    (ServiceLimits(), 33, 200, ""),
    (ServiceLimits(), 100, 200, ""),
    (ServiceLimits(), 101, 413, "texts: expected at most 100 texts, found more than 100"),
    (ServiceLimits(max_texts=3), 4, 413, "texts: expected at most 3 texts, found more than 3"),
    (ServiceLimits(max_request_chars=20), 3, 413,
     "texts: expected at most 20 characters in all, found more (21 up to texts[2])"),
])
def test_annotate_has_one_reachable_limit_per_field(indexes, limits, texts, status, message):
    with TestClient(_annotating_app(indexes, limits)) as c:
        response = c.post("/annotate", json={"texts": [{"text": "nausea.", "id": i} for i in range(texts)]})
        assert c.app.state.internal_errors == 0
    assert response.status_code == status, response.text
    if status == 200:
        assert len(response.json()["results"]) == texts
    else:
        assert response.json() == {"error": message, "field": "texts"}


def test_annotate_answers_429_when_the_tagger_queue_is_full(indexes):
    app = _annotating_app(indexes)
    app.state.tagger.max_pending = 5
    with TestClient(app) as c:
        response = c.post("/annotate", json={"texts": [{"text": "nausea"}]})
    assert response.status_code == 429 and response.headers["retry-after"] == "1"
    assert response.json() == {"error": "texts: expected room in the tagger's queue (retry shortly), found 0 "
                                        "characters are waiting", "field": "texts"}


def test_annotate_answers_429_when_its_index_queue_is_full(indexes):
    app = _annotating_app(indexes)
    app.state.indexes["meddra"].batcher.max_pending = 0
    with TestClient(app) as c:
        response = c.post("/annotate", json={"texts": [{"text": "nausea"}]})
        assert c.post("/annotate", json={"texts": [{"text": "no event"}]}).status_code == 200  # nothing to link
    assert response.status_code == 429 and response.headers["retry-after"] == "1"
    assert response.json()["field"] == "texts" and "queue of index meddra" in response.json()["error"]


def _tag(tagger, texts):
    """Queue texts on a Tagger; an Event set when done and a dict that then holds the job."""
    done, box = threading.Event(), {}

    def on_done(job):
        box["job"] = job
        done.set()

    tagger.submit(texts, None, "auto", on_done)
    return done, box


def test_tagger_tags_a_short_request_between_the_slices_of_a_long_one_and_isolates_failures():
    from linker.service import Tagger

    fake = _FakeExtractor()
    fake.release.clear()
    tagger = Tagger(10**6, load=lambda: fake)
    long = [f"{i} nausea " + "x" * 1500 for i in range(6)]  # 1,500+ characters: one text a slice
    long_done, long_box = _tag(tagger, long)
    time.sleep(0.2)  # the worker is now inside the long request's first slice
    short_done, short_box = _tag(tagger, ["nausea", "ok"])  # 8 characters: one slice
    boom_done, boom_box = _tag(tagger, ["boom"])
    fake.release.set()
    assert long_done.wait(10) and short_done.wait(10) and boom_done.wait(10)
    assert fake.calls[1] == ["nausea", "ok"] and fake.calls[2] == ["boom"]  # not behind the long request's 6 slices
    assert [len(spans) for spans in long_box["job"].results] == [1] * 6
    assert [s.start for spans in long_box["job"].results for s in spans] == [2] * 6  # every slice in its place
    assert short_box["job"].model == "fake-ae==1" and short_box["job"].error is None
    assert str(boom_box["job"].error) == "boom" and long_box["job"].error is None
    assert tagger._pending == 0


def test_tagger_refuses_characters_beyond_its_queue():
    from linker.service import BusyError, Tagger

    fake = _FakeExtractor()
    fake.release.clear()
    tagger = Tagger(10, load=lambda: fake)
    first, _ = _tag(tagger, ["nausea", "ab"])  # 8 characters
    with pytest.raises(BusyError, match="8 characters are waiting"):
        _tag(tagger, ["abc"])
    fake.release.set()
    assert first.wait(10)
    again, _ = _tag(tagger, ["abc"])  # admitted once the queue drained
    assert again.wait(10)


def test_a_tagger_queue_smaller_than_one_request_is_refused_at_start_up():
    with pytest.raises(ConfigError, match="max_pending_chars 10 is below max_request_chars 100"):
        ServiceLimits(max_request_chars=100, max_pending_chars=10)
    assert ServiceLimits(max_request_chars=100).max_pending_chars == 200


def test_the_docs_list_every_endpoint_and_every_limit(client):
    import dataclasses

    page = (ROOT / "docs" / "service.md").read_text(encoding="utf-8")
    routes = {f"{method} {route.path}" for route in client.app.routes if route.path in client.app.openapi()["paths"]
              for method in route.methods}
    assert routes == {"POST /link", "POST /annotate", "GET /health", "GET /indexes"}
    intro = page.split("\n\n")[1]
    assert all(f"`{route}`" in intro for route in routes), intro
    limits = page.split("## Limits")[1].split("\n## ")[0]
    names = {f.name for f in dataclasses.fields(ServiceLimits)} - {"default_k"}
    assert [name for name in sorted(names) if f"`{name}`" not in limits] == []


# ---- dynamic batching: concurrent requests share Linker.link calls on one inference pool ----

class _CountingLinker:
    """Wraps a Linker: counts its link calls (the mentions of each), holds the first call until `release`."""

    def __init__(self, linker) -> None:
        self.linker, self.calls, self.release = linker, [], threading.Event()

    def link(self, texts, *, k, langs):
        if not self.calls:
            self.release.wait(10)
        self.calls.append(list(texts))
        return self.linker.link(texts, k=k, langs=langs)


def _concurrent_posts(app, bodies, release=None):
    """POST /link each of `bodies` at once from one event loop (as a server's clients), `release` set once all were
    sent; the responses in order."""
    import asyncio

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            tasks = [asyncio.create_task(http.post("/link", json=body)) for body in bodies]
            await asyncio.sleep(0.5)  # every request parsed and queued behind the held first call
            if release is not None:
                release.set()
            return await asyncio.gather(*tasks)

    return asyncio.run(run())


def test_concurrent_requests_share_one_call_and_answer_as_sequential_ones(indexes):
    texts = ["hair loss", "head pain", "nausea", "Itching", "dizziness", "alopecia", "náuseas", "headache"]
    bodies = [{"mentions": [{"text": t, "id": i}], "k": 3} for i, t in enumerate(texts)]
    with TestClient(create_app([indexes["meddra"]])) as c:
        sequential = [c.post("/link", json=body).content for body in bodies]
    app = create_app([indexes["meddra"]])
    batcher = app.state.indexes["meddra"].batcher
    batcher.linker = counting = _CountingLinker(batcher.linker)
    responses = _concurrent_posts(app, bodies, counting.release)
    assert [r.status_code for r in responses] == [200] * len(bodies)
    assert [r.content for r in responses] == sequential  # byte for byte
    # the first call took the requests queued when it began (one, or all 8 when the worker was slower to start);
    # all the others came during it and shared the second
    assert len(counting.calls) <= 2 and sum(map(len, counting.calls)) == len(bodies)


def test_whole_small_requests_share_a_call_even_when_calls_are_sized_small():
    """8 requests of 10 mentions with a call sized at 16: each request whole in one call of 70 (the other after
    the first), where shares of 16 // 8 = 2 mentions cut each into 5 calls."""
    from linker.service import MentionBatcher

    fake = _RecordingLinker()
    batcher = MentionBatcher(fake, "fake")
    batcher.cost.per_mention = MentionBatcher.CALL_SECONDS / 16  # calls sized at 16 mentions
    batcher.cost.add = lambda n, seconds: None  # the measured cost of the stand-in's calls must not change it
    assert batcher.batch_size() == 16
    jobs = [_submit(batcher, [f"{i}.{r}" for i in range(10)]) for r in range(1)]
    time.sleep(0.2)  # the worker is now inside its first call, on the first request alone
    jobs += [_submit(batcher, [f"{i}.{r}" for i in range(10)]) for r in range(1, 8)]
    fake.release.set()
    assert all(done.wait(10) for done, _ in jobs)
    assert [len(call) for call in fake.calls] == [10, 70]
    assert all(box["job"].results == [(f"{i}.{r}", 1, None) for i in range(10)] for r, (_, box) in enumerate(jobs))


def test_a_call_waits_for_the_requests_in_flight_but_a_lone_client_never_waits():
    from linker.service import MentionBatcher

    fake = _RecordingLinker()
    fake.release.set()
    batcher = MentionBatcher(fake, "fake")
    batcher.cost.fixed, batcher.cost.add = 1.0, lambda n, seconds: None  # waiting is worth up to 1 s
    first, _ = _submit(batcher, ["alone"])  # one request in flight at the start: linked at once
    started = time.perf_counter()
    assert first.wait(10) and time.perf_counter() - started < 0.5
    batcher._expected, batcher._last_call = 3, time.perf_counter()  # 3 requests were answered by the last call
    done = [_submit(batcher, ["a"])]
    time.sleep(0.1)
    done += [_submit(batcher, ["b"]), _submit(batcher, ["c"])]
    assert all(event.wait(10) for event, _ in done)
    assert fake.calls[1:] == [["a", "b", "c"]]  # "a" waited for the two others instead of riding alone


def test_call_cost_separates_the_fixed_part_from_the_cost_a_mention():
    from linker.service import CallCost, MentionBatcher

    cost = CallCost(0.003)
    cost.add(10, 0.4 + 10 * 0.02)  # one size alone: both parts scaled to it (no fixed part known yet)
    assert (cost.fixed, cost.per_mention) == (0.0, pytest.approx(0.06))
    cost.add(60, 0.4 + 60 * 0.02)
    assert (cost.fixed, cost.per_mention) == (pytest.approx(0.4), pytest.approx(0.02))
    alike = CallCost(0.02)
    alike.fixed = 0.4
    alike.add(60, 2 * (0.4 + 60 * 0.02))  # calls all of one size, twice the time: the load doubled both parts
    assert (alike.fixed, alike.per_mention) == (pytest.approx(0.8), pytest.approx(0.04))
    batcher = MentionBatcher(_RecordingLinker(), "fake")
    batcher.cost.fixed, batcher.cost.per_mention = 0.4, 0.02
    # by time alone (CALL_SECONDS = 0.2) a call would hold no mention; the fixed part at most a fifth: 80 mentions
    assert batcher.batch_size() == 80


def test_the_inference_pool_runs_at_most_its_threads_and_each_queue_on_one_thread_at_a_time():
    from linker.service import InferencePool, MentionBatcher

    running, most, lock = {}, {"all": 0}, threading.Lock()

    class Slow:
        def __init__(self, name):
            self.name = name

        def link(self, texts, *, k, langs):
            with lock:
                running[self.name] = running.get(self.name, 0) + 1
                most["all"] = max(most["all"], sum(running.values()))
                most[self.name] = max(most.get(self.name, 0), running[self.name])
            time.sleep(0.05)
            with lock:
                running[self.name] -= 1
            return list(texts)

    pool = InferencePool(2)
    batchers = [MentionBatcher(Slow(name), name, pool=pool) for name in ("a", "b", "c")]
    jobs = [_submit(b, [str(i)]) for _ in range(4) for b in batchers for i in range(3)]
    assert all(done.wait(20) for done, _ in jobs)
    assert most["all"] == 2 and max(most[name] for name in "abc") == 1
    assert pool.math_threads == max(1, linker.precision.available_cpus() // 2)


def test_a_step_gets_the_cores_over_the_queues_with_work(monkeypatch):
    # the threads a step starts of its own (the re-ranker's batches): every core while the other queues are idle,
    # half of them while a second queue waits
    from linker.precision import thread_budget
    from linker.service import InferencePool

    monkeypatch.setattr("linker.service.batcher.available_cpus", lambda: 4)
    monkeypatch.setattr("linker.precision.available_cpus", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    first_running, second_queued, done = threading.Event(), threading.Event(), threading.Event()

    class Source:
        def __init__(self, steps):
            self.steps, self.shares = steps, []

        def has_work(self):
            return len(self.shares) < self.steps

        def step(self):
            self.shares.append(thread_budget(99))
            if self is first and len(self.shares) == 1:
                first_running.set()
                assert second_queued.wait(10)
            if not first.has_work() and not second.has_work():
                done.set()

    pool = InferencePool(1)
    first, second = Source(2), Source(1)
    for source in (first, second):
        pool.attach(source)
    pool.wake(first)
    assert first_running.wait(10)
    pool.wake(second)  # lined up while the first one's step runs
    second_queued.set()
    assert done.wait(10)
    assert (first.shares, second.shares) == ([4, 4], [2])


def test_annotate_links_its_events_in_the_calls_of_link_requests(indexes):
    app = _annotating_app(indexes)
    batcher = app.state.indexes["meddra"].batcher
    batcher.linker = counting = _CountingLinker(batcher.linker)

    async def run():
        import asyncio

        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            first = asyncio.create_task(http.post("/link", json={"mentions": [{"text": "hair loss"}]}))
            await asyncio.sleep(0.3)  # its call holds the index's batcher
            rest = [asyncio.create_task(http.post("/annotate", json={"texts": [{"text": "severe nausea"}]})),
                    asyncio.create_task(http.post("/link", json={"mentions": [{"text": "Itching"}], "k": 1}))]
            await asyncio.sleep(0.5)
            counting.release.set()
            return await asyncio.gather(first, *rest)

    import asyncio

    responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert responses[1].json()["results"][0]["spans"][0]["code"] == "10028813"
    # the adverse event beside the /link mention of the same k (a call is per k and language)
    assert sorted(counting.calls[1]) == ["Itching", "nausea"], counting.calls


def test_the_pool_has_a_thread_per_queue_at_most_one_per_core_and_shares_the_cores_among_them(monkeypatch):
    from linker.service import InferencePool, MentionBatcher, Tagger

    cases = ((2, 1, 2, 1), (2, 3, 2, 1), (16, 1, 2, 8), (16, 3, 4, 4), (1, 1, 1, 1))  # cores, indexes: the pool
    for cores, indexes, threads, math_threads in cases:
        monkeypatch.setattr("linker.service.batcher.available_cpus", lambda cores=cores: cores)
        pool = InferencePool()
        for i in range(indexes):
            MentionBatcher(_RecordingLinker(), f"index{i}", pool=pool)
        Tagger(10, load=_FakeExtractor, pool=pool)  # /annotate's, one for every index
        assert (pool.threads, pool.math_threads) == (threads, math_threads), cores

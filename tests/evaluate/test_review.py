"""`grpokit review` without a browser: finding samples, the label database, agreement, exports,
bad input, and the run report's section."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from review_samples import CHECKLIST_CONFIG, eval_rows, make_eval_dir, make_generate_file

from grpokit.cli import main
from grpokit.core.stats import cohen_kappa, spearman
from grpokit.errors import UserError
from grpokit.evaluate import review_agreement as ra
from grpokit.evaluate.report import build_report
from grpokit.evaluate.review_data import (
    LabelStore,
    ReviewSample,
    checklist_items,
    find_samples,
    items_from_scores,
    overall,
)
from grpokit.evaluate.review_server import ReviewApp, make_server


def test_finds_the_samples_of_an_eval_a_run_and_a_generate_file(
    tmp_path: Path, run_dir: Path
) -> None:
    found = find_samples(make_eval_dir(tmp_path / "eval"))
    assert found.kind == "eval" and len(found.samples) == 12
    assert found.db_path == tmp_path / "eval" / "review.sqlite"
    first = found.samples[0]
    assert first.origin == "base" and first.prompt == "Business idea #0 <b>bold</b>"
    assert set(first.scores) == {"total", "xml_format", "quality", "checklist/price",
                                 "checklist/customer"}  # fmt: skip
    assert len({s.id for s in found.samples}) == 12
    assert [i.name for i in items_from_scores(found.samples)] == ["price", "customer"]

    run = find_samples(run_dir)
    assert run.kind == "run" and run.config is not None and len(run.samples) == 24
    assert run.samples[0].origin == "step 1"
    assert run.samples[0].prompt == "体重を減らすにはどうすれば良いですか"  # system prompt left out
    assert run.samples[0].scores["repetition_penalty"] is None

    gen = make_generate_file(tmp_path / "gen" / "samples.jsonl")
    for given in (gen, gen.parent):
        found = find_samples(given)
        assert found.kind == "generate" and len(found.samples) == 4
        assert found.db_path == gen.parent / "samples.review.sqlite"
        assert found.samples[0].completion == "hi a 0" and found.samples[0].origin == "a"


def test_checklist_items_come_from_the_config() -> None:
    items = checklist_items(yaml.safe_load(CHECKLIST_CONFIG))
    assert [(i.name, i.weight) for i in items] == [("price", 2.0), ("customer", 1.0)]
    assert items[0].text == "price"
    assert items[1].text.startswith("Proposal:\n[the answer]\nDoes it name")
    assert overall({"price": 1, "customer": 0}, items) == pytest.approx(2 / 3)
    bad = yaml.safe_load(CHECKLIST_CONFIG.replace("regex: '\\d+ ?(usd|yen)'", "regex: '('"))
    with pytest.raises(UserError, match=r"rewards\[1\].items\[0\]: item 'price': regex"):
        checklist_items(bad)


def test_no_samples_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no completions.jsonl"):
        find_samples(tmp_path / "empty")
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "completions.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(UserError, match="holds no samples"):
        find_samples(tmp_path / "blank")
    with pytest.raises(UserError, match="does not exist"):
        find_samples(tmp_path / "missing")


def test_labels_persist_with_a_recorded_order_and_two_reviewers(tmp_path: Path) -> None:
    found = find_samples(make_eval_dir(tmp_path / "eval"))
    items = items_from_scores(found.samples)
    store = LabelStore.open(found, items, seed=7)
    order = [s.id for s in store.order(found.samples)]
    assert sorted(order) == sorted(s.id for s in found.samples)
    assert order != [s.id for s in found.samples]  # shuffled: file order would group models
    store.save(order[0], "ann", {"price": 1, "customer": 0}, None, "cheap")
    store.save(order[0], "bob", {"price": 0, "customer": 0}, None, "")
    store.save(order[0], "ann", {"price": 1, "customer": 1}, None, "changed my mind")
    with pytest.raises(ValueError, match="grade every item"):
        store.save(order[1], "ann", {"price": 1}, None, "")

    again = LabelStore.open(found, [], seed=99)  # the recorded seed and items win
    assert again.seed == 7 and [i.name for i in again.items] == ["price", "customer"]
    assert [s.id for s in again.order(found.samples)] == order
    ann = again.labels("ann")
    assert len(ann) == 1 and ann[0].grades == {"price": 1, "customer": 1}
    assert ann[0].score == 1.0 and ann[0].note == "changed my mind"
    assert again.reviewers() == ["ann", "bob"]


def test_a_database_of_other_samples_is_refused(tmp_path: Path) -> None:
    a = find_samples(make_eval_dir(tmp_path / "a"))
    LabelStore.open(a, [], seed=1)
    b_dir = make_eval_dir(tmp_path / "b", eval_rows(prompts=2)[3:])
    shutil.copy(a.db_path, b_dir / "review.sqlite")
    with pytest.raises(UserError, match="holds the labels of other samples"):
        LabelStore.open(find_samples(b_dir), [])
    (b_dir / "review.sqlite").write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(UserError, match="not a grpokit review database"):
        LabelStore.open(find_samples(b_dir), [])


def _label_all(tmp_path: Path) -> tuple[list[ReviewSample], LabelStore]:
    found = find_samples(make_eval_dir(tmp_path / "eval"))
    store = LabelStore.open(found, items_from_scores(found.samples), seed=3)
    for i, s in enumerate(found.samples):
        price = int(s.scores["checklist/price"] or 0)  # ann agrees with the price program
        customer = i % 3 == 0  # and not much with the judge's customer item
        store.save(s.id, "ann", {"price": price, "customer": int(customer)}, None, "")
        if i < 6:
            store.save(s.id, "bob", {"price": price, "customer": 1}, None, "")
    return found.samples, store


def test_agreement_per_item_and_overall(tmp_path: Path) -> None:
    samples, store = _label_all(tmp_path)
    rows = ra.agreement(samples, store)
    by = {(r.reviewer, r.scorer, r.item): r for r in rows}
    price = by[("ann", "checklist/price", "price")]
    assert price.measure == "kappa" and price.value == pytest.approx(1.0) and price.n == 12
    customer = by[("ann", "checklist/customer", "customer")]
    person = [i % 3 == 0 for i in range(12)]
    judge = [(s.scores["checklist/customer"] or 0) >= 0.5 for s in samples]
    assert customer.value == pytest.approx(cohen_kappa(person, judge)[0])
    assert customer.agreed == pytest.approx(
        sum(a == b for a, b in zip(person, judge, strict=True)) / 12
    )
    total = by[("ann", "total", None)]
    ann = {lab.sample_id: lab.score for lab in store.labels("ann")}
    assert total.measure == "spearman" and total.n == 12
    assert total.value == pytest.approx(
        spearman([ann[s.id] for s in samples], [s.scores["total"] for s in samples])
    )
    assert total.low < total.value < total.high
    assert ("ann", "reviewer bob", "price") in by and ("ann", "reviewer bob", None) in by
    assert by[("ann", "reviewer bob", "price")].n == 6
    text = ra.agreement_text(rows)
    assert "Cohen's kappa" in text and "Spearman" in text and "reviewer bob" in text


def test_exports_preference_pairs_and_a_reward_model_set(tmp_path: Path) -> None:
    from trl.data_utils import is_conversational

    samples, store = _label_all(tmp_path)
    scores = ra.person_scores(samples, store)
    pairs = ra.labelled_pairs(samples, scores)
    assert pairs
    for better, worse, margin in pairs:
        assert better.prompt == worse.prompt and scores[better.id] > scores[worse.id]
        assert margin == pytest.approx(scores[better.id] - scores[worse.id])
    plain = ra.preference_rows(pairs)
    assert set(plain[0]) == {"prompt", "chosen", "rejected"}
    assert not is_conversational(plain[0])
    rm = ra.reward_model_rows(pairs)
    assert set(rm[0]) == {"prompt", "chosen", "rejected", "margin"}
    assert is_conversational(rm[0])
    assert rm[0]["chosen"][0]["role"] == "assistant" and rm[0]["prompt"][0]["role"] == "user"
    assert rm[0]["chosen"][0]["content"] == plain[0]["chosen"]

    out = tmp_path / "out"
    res = CliRunner().invoke(
        main,
        ["review", str(tmp_path / "eval"), "--report", "--export-pairs", str(out / "p.jsonl"),
         "--export-rm", str(out / "rm.jsonl")],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "Cohen's kappa" in res.output and f"preference pairs: {len(pairs)}" in res.output
    lines = (out / "rm.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == rm


def test_bad_input_exits_2_with_one_message(tmp_path: Path) -> None:
    runner = CliRunner()
    (tmp_path / "empty").mkdir()
    res = runner.invoke(main, ["review", str(tmp_path / "empty")])
    assert res.exit_code == 2 and "no completions.jsonl" in res.output
    assert "Traceback" not in res.output
    make_eval_dir(tmp_path / "eval")
    res = runner.invoke(main, ["review", str(tmp_path / "eval"), "--report"])
    assert res.exit_code == 2 and "no labels yet" in res.output
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = runner.invoke(main, ["review", str(tmp_path / "eval"), "--port", str(port)])
    assert res.exit_code == 2 and f"--port {port}: the port is in use" in res.output
    res = runner.invoke(main, ["review", str(tmp_path / "eval"), "--report", "--export-pairs",
                               str(tmp_path / "p.jsonl")])  # fmt: skip
    assert res.exit_code == 2 and "no pairs to export" in res.output


def test_the_server_refuses_other_hosts_and_form_posts(tmp_path: Path) -> None:
    import http.client
    import threading

    found = find_samples(make_eval_dir(tmp_path / "eval"))
    store = LabelStore.open(found, items_from_scores(found.samples), seed=0)
    server = make_server(ReviewApp(store, found.samples, "ann"))
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:

        def request(method: str, path: str, body: str = "", **headers: str) -> tuple[int, bytes]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request(method, path, body=body, headers=headers)
            res = conn.getresponse()
            return res.status, res.read()

        status, page = request("GET", "/")
        assert status == 200 and b'<script src="/review.js">' in page
        assert request("GET", "/api/state", Host="evil.example:80")[0] == 403
        sid = store.order(found.samples)[0].id
        form = f"id={sid}"
        assert request("POST", "/api/label", form,
                       **{"Content-Type": "application/x-www-form-urlencoded"})[0] == 404  # fmt: skip
        body = json.dumps({"id": sid, "grades": {"price": 1}, "note": ""})
        status, reply = request("POST", "/api/label", body, **{"Content-Type": "application/json"})
        assert status == 400 and b"grade every item" in reply
        assert store.labels() == []
        status, reply = request("GET", "/api/sample/0")
        sample = json.loads(reply)
        assert status == 200 and sample["id"] == sid and set(sample) == {"id", "prompt",
                                                                         "completion"}  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()


def test_run_report_shows_the_agreement(run_dir: Path) -> None:
    found = find_samples(run_dir)
    store = LabelStore.open(found, [], seed=0)
    for i, s in enumerate(found.samples[:10]):
        store.save(s.id, "ann", {}, (i % 5) / 4, f"note {i}")
    html = build_report(run_dir).read_text(encoding="utf-8")
    assert "Human review against the rewards" in html
    assert "logic_tree_depth" in html.split('id="review"')[1] and "Spearman" in html
    assert "10 label(s) by 1 reviewer(s)" in html


def test_run_report_warns_about_a_foreign_database(run_dir: Path, tmp_path: Path) -> None:
    other = find_samples(make_eval_dir(tmp_path / "eval"))
    LabelStore.open(other, [], seed=0)
    shutil.copy(other.db_path, run_dir / "review.sqlite")
    html = build_report(run_dir).read_text(encoding="utf-8")
    assert "holds the labels of other samples" in html


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_server_stops_on_a_signal_with_a_connection_open(tmp_path: Path, stop: int) -> None:
    """Ctrl-C or SIGTERM stops `grpokit review` at once with its closing line and exit code 0:
    sent as soon as the address is printed, while a browser holds a connection that sends
    nothing (a preconnect or a kept-alive socket) and one that sent half a request, in a process
    that started with SIGINT ignored (as a shell starts a command in the background). Before,
    such a server never stopped on SIGINT (the browser test waited 60 s for it so), and SIGTERM
    or a signal sent right after the address killed it without its closing line."""
    gen = make_generate_file(tmp_path / "gen" / "samples.jsonl")
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpokit", "review", str(gen), "--reviewer", "ann"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_ignore_sigint,
    )
    assert proc.stdout is not None
    try:
        first = proc.stdout.readline()  # the URL, printed once the port is bound
        port = int(first.split("http://127.0.0.1:", 1)[1].split("/", 1)[0])
        with (
            socket.create_connection(("127.0.0.1", port)),  # idle
            socket.create_connection(("127.0.0.1", port)) as half,
        ):
            half.sendall(b"GET /api/state HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % port)
            proc.send_signal(stop)
            # Generous for a loaded machine; it takes about 0.5 s (the server's poll interval).
            out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, first + out
    assert "stopped; 0 label(s) by ann" in out

"""Open the report in a real headless Chromium: images render, no console output, a screenshot."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from grpokit.evaluate.report import build_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium)"
)
SCREENSHOT_COPY = Path("/tmp/grpokit_report_screenshot.png")

# Appended to a copy of the page only: the report itself carries no script.
PROBE = """<script>
window.addEventListener("load", () => {
  const out = document.createElement("pre");
  out.id = "grpokit-probe";
  out.textContent = JSON.stringify([...document.images].map(
    (i) => ({w: i.naturalWidth, h: i.naturalHeight, data: i.src.startsWith("data:image/png")})));
  document.body.appendChild(out);
});
</script>"""


def chromium(page: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
        "--virtual-time-budget=5000", *extra, page.as_uri(),
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)


def console_lines(stderr: str) -> list[str]:
    """Chromium logs every console message (any level) and page error as a CONSOLE line."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def probe_images(page: Path, tmp: Path) -> tuple[list[dict[str, object]], list[str]]:
    """(natural sizes of the page's images after load, console lines of the load)."""
    copy = tmp / f"probe-{page.name}"
    copy.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"))
    res = chromium(copy, tmp / "profile-probe", "--dump-dom")
    match = re.search(r'<pre id="grpokit-probe">(.*?)</pre>', res.stdout, re.S)
    assert match, "the probe did not run: page not loaded"
    images = json.loads(match.group(1).replace("&quot;", '"'))
    # The probe itself logs nothing, so console lines come from the page.
    return images, console_lines(res.stderr)


# Reads what a reader sees of each transcript block: its kind, its text, its colours.
TRANSCRIPT_PROBE = """<script>
window.addEventListener("load", () => {
  const out = document.createElement("pre");
  out.id = "grpokit-transcripts";
  out.textContent = JSON.stringify({
    scripts: document.scripts.length,
    images: document.images.length,
    blocks: [...document.querySelectorAll("#samples .transcript .msg")].map((m) => ({
      kind: m.className.replace("msg ", ""),
      who: m.querySelector(".who").textContent,
      text: m.querySelector("pre").textContent,
      background: getComputedStyle(m).backgroundColor,
      border: getComputedStyle(m).borderLeftColor,
    })),
  });
  document.body.appendChild(out);
});
</script>"""
HOSTILE = '</pre></div><script>console.error("pwned")</script><img src=x onerror=alert(1)>'
TRANSCRIPT = [
    {"role": "assistant", "content": "Let me look.",
     "tool_calls": [{"name": "lookup", "arguments": {"q": "<b>x</b>"}}]},
    {"role": "tool", "name": "lookup", "content": HOSTILE, "error": False},
    {"role": "assistant", "content": "Done.", "tool_calls": [{"name": "nope", "arguments": {}}]},
    {"role": "tool", "name": "nope", "content": '{"error": "unknown tool"}', "error": True},
    {"role": "assistant", "content": "It is 7."},
]  # fmt: skip


def test_probe_detects_broken_images_and_console_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<html><body><img src="missing.png"><script>console.error("boom")</script></body></html>'
    )
    images, console = probe_images(bad, tmp_path)
    assert images == [{"w": 0, "h": 0, "data": False}]
    assert any('"boom"' in line for line in console)


def test_report_renders_in_headless_chromium(run_dir: Path, tmp_path: Path) -> None:
    report = build_report(run_dir)
    images, console = probe_images(report, tmp_path)
    assert len(images) == 6
    for image in images:
        assert image["data"] is True
        assert isinstance(image["w"], int) and image["w"] >= 800
        assert isinstance(image["h"], int) and image["h"] >= 250
    assert console == []

    shot = tmp_path / "report.png"
    res = chromium(
        report, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1240,7200",
        "--hide-scrollbars",
    )  # fmt: skip
    assert console_lines(res.stderr) == []
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 100_000
    shutil.copyfile(shot, SCREENSHOT_COPY)


def test_report_of_a_real_training_run_renders(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A real (tiny) GRPO run, then its report in Chromium: what a user gets after `train`."""
    import yaml

    from grpokit.config import load_config
    from grpokit.train.trainer import GRPOTrainer

    (tmp_path / "train.jsonl").write_text(
        "".join(json.dumps({"prompt": f"Count to {i}."}) + "\n" for i in range(4))
    )
    doc = {
        "model": {"name_or_path": str(tiny_model_dir)},
        "data": {"train": "train.jsonl"},
        "rewards": [{"type": "regex_match", "pattern": "[aeiou]"}, {"type": "repetition_penalty"}],
        "training": {"num_generations": 4, "per_device_train_batch_size": 8, "beta": 0.04,
                     "max_completion_length": 8, "max_steps": 3, "report_to": ["none"],
                     "output_dir": "run"},
    }  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(doc))
    result = GRPOTrainer(load_config(tmp_path / "config.yaml"), progress=False).train()
    report = build_report(result.run_dir)
    images, console = probe_images(report, tmp_path)
    assert len(images) >= 5 and all(i["data"] is True and i["w"] >= 800 for i in images), images
    assert console == []
    assert "regex_match" in report.read_text(encoding="utf-8")


def test_transcripts_render_with_tool_calls_and_results_marked(
    run_dir: Path, tmp_path: Path
) -> None:
    """A run with tools: each sample card shows the whole transcript, the calls and the results
    in blocks of their own colours, and a tool result made of markup stays text."""
    path = run_dir / "completions.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    path.write_text(
        "".join(
            json.dumps(r | {"transcript": TRANSCRIPT}, ensure_ascii=False) + "\n" for r in rows
        ),
        encoding="utf-8",
    )
    report = build_report(run_dir)
    copy = tmp_path / "probe-transcripts.html"
    page = report.read_text(encoding="utf-8")
    copy.write_text(page.replace("</body>", TRANSCRIPT_PROBE + "</body>"), encoding="utf-8")
    res = chromium(copy, tmp_path / "profile-transcripts", "--dump-dom")
    match = re.search(r'<pre id="grpokit-transcripts">(.*?)</pre>', res.stdout, re.S)
    assert match, "the probe did not run: page not loaded"
    seen = json.loads(html.unescape(match.group(1)))
    assert console_lines(res.stderr) == []  # the tool's script never ran
    assert seen["scripts"] == 1 and seen["images"] == 6  # the probe's; the plots only
    blocks = seen["blocks"]
    cards = len(blocks) // 7
    assert cards >= 2 and len(blocks) == 7 * cards  # early and late cards, 7 blocks each
    first = blocks[:7]
    assert [b["kind"] for b in first] == [
        "turn", "tool-call", "tool-result", "turn", "tool-call", "tool-error", "turn",
    ]  # fmt: skip
    assert first[1]["text"] == 'lookup({"q": "<b>x</b>"})'
    assert first[2]["who"] == "tool result · lookup" and first[2]["text"] == HOSTILE
    assert first[5]["who"] == "tool error · nope"
    # Calls, results and errors each have their own colours, none the model's plain turn's.
    colours = {b["kind"]: (b["background"], b["border"]) for b in first}
    assert len(set(colours.values())) == 4

"""The token page: its structure (parsed here) and its rendering in headless Chromium (the DOM after the page's
script ran, and a screenshot that is not blank)."""

import html.parser
import io
import shutil
import subprocess

import pytest
import torch
from PIL import Image

from vepo_trl.insight import SelectionRecord, save_records
from vepo_trl.insight.page import render_page, write_page

from .support import make_records


class Spans(html.parser.HTMLParser):
    """Collects every token span's attributes, per completion."""

    def __init__(self):
        super().__init__()
        self.completions, self.legend, self.images, self.scripts = [], [], 0, 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = attrs.get("class", "").split()
        if "completion" in classes:
            self.completions.append({"expected": int(attrs["data-tokens"]), "spans": []})
        elif "tok" in classes:
            self.completions[-1]["spans"].append(attrs)
        elif "legend-item" in classes:
            self.legend.append(attrs["data-class"])
        elif tag == "img":
            self.images += 1
            assert attrs["src"].startswith("data:image/png;base64,")
        elif tag in ("script", "link") and (attrs.get("src") or attrs.get("href")):
            raise AssertionError(f"the page loads {tag} from outside: {attrs}")


def test_page_has_one_span_per_token_with_its_values():
    records = make_records()
    parsed = Spans()
    parsed.feed(render_page(records))
    assert parsed.legend == ["both", "run", "entropy", "none", "topjsd"]
    assert parsed.images == 1  # one prompt, one image
    assert [c["expected"] for c in parsed.completions] == [r.num_tokens for r in records]
    for record, completion in zip(records, parsed.completions):
        spans = completion["spans"]
        assert len(spans) == record.num_tokens
        for i, attrs in enumerate(spans):
            classes = attrs["class"].split()
            expected = {(True, True): "sel-both", (True, False): "sel-run", (False, True): "sel-entropy"}.get(
                (record.selected[i], record.entropy_top_k[i]), "sel-none"
            )
            assert expected in classes
            assert ("topjsd" in classes) == record.jsd_top_k[i]
            assert float(attrs["data-jsd"]) == pytest.approx(record.jsd[i], abs=1e-4)
            assert float(attrs["data-dh"]) == pytest.approx(record.entropy_gap[i], abs=1e-4)
            assert float(attrs["data-h"]) == pytest.approx(record.entropy[i], abs=1e-4)
            assert float(attrs["data-score"]) == pytest.approx(record.score[i], abs=1e-4)
            assert f"JSD {record.jsd[i]:.4f}" in attrs["title"]


def test_page_escapes_text():
    page = render_page(make_records())
    assert "<b>bold</b>" not in page and "&lt;b&gt;bold&lt;/b&gt; &amp; co" in page
    # The completion says <think>: its pieces are escaped, so no such element exists
    assert "<think>" not in page and "&lt;" in page


def test_records_without_visual_signals_render():
    record = SelectionRecord(
        tokens=["a", "b"], token_ids=[1, 2], entropy=[0.1, 0.2], selected=[True, False],
        entropy_top_k=[True, False], strategy="entropy", k=0.5, alpha=0.7,
    )  # fmt: skip
    page = render_page([record])
    assert 'data-jsd="n/a"' in page and "selection (entropy) only" in page


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _run_chromium(binary, *args, timeout=90):
    # --no-sandbox: CI runs as root; a throwaway profile keeps runs apart
    command = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
               "--no-first-run", "--mute-audio", *args]  # fmt: skip
    return subprocess.run(command, capture_output=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def chromium():
    binary = _chromium()
    if binary is None:
        pytest.skip("no Chromium binary on PATH (Debian: apt-get install chromium; .ci/run installs it)")
    return binary


@pytest.fixture(scope="module")
def page_file(tmp_path_factory):
    records = make_records()
    folder = tmp_path_factory.mktemp("page")
    save_records(folder / "records.jsonl", records)
    return write_page(folder / "page.html", records), records


def test_page_renders_in_chromium(chromium, page_file, tmp_path):
    path, records = page_file
    result = _run_chromium(chromium, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", path.as_uri())
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    dom = result.stdout.decode()
    parsed = Spans()
    parsed.feed(dom)
    # The browser's DOM keeps the legend, one span per completion token and the hover values
    assert parsed.legend == ["both", "run", "entropy", "none", "topjsd"]
    assert [len(c["spans"]) for c in parsed.completions] == [r.num_tokens for r in records]
    first = parsed.completions[0]["spans"][0]
    assert float(first["data-jsd"]) == pytest.approx(records[0].jsd[0], abs=1e-4)
    assert "score" in first["title"]
    assert 'id="tip"' in dom and "<svg" in dom
    # The page's script ran to its end and gave every token a tooltip
    assert f'data-tooltips="{sum(r.num_tokens for r in records)}"' in dom


def test_hover_shows_the_values_in_chromium(chromium, page_file, tmp_path):
    path, records = page_file
    # Hover the second token of the first completion, as a pointer would, then read the DOM
    hovered = tmp_path / "hovered.html"
    hover = "<script>document.querySelectorAll('.tok')[1].dispatchEvent(new MouseEvent('mouseenter'));</script>"
    hovered.write_text(path.read_text().replace("</body>", hover + "</body>"))
    result = _run_chromium(chromium, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", hovered.as_uri())
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    dom = result.stdout.decode()
    tip = dom.split('<div id="tip"', 1)[1].split("</div>", 1)[0]
    assert "display: block" in tip
    record = records[0]
    assert f"JSD   {record.jsd[1]:.4f}" in tip and f"H     {record.entropy[1]:.4f}" in tip
    assert f"score {record.score[1]:.4f}" in tip and "selected by:" in tip
    # The signal plot's cursor moved to the token
    assert 'visibility="visible"' in dom


def test_page_screenshot_is_not_blank(chromium, page_file, tmp_path):
    path, _ = page_file
    shot = tmp_path / "page.png"
    result = _run_chromium(
        chromium, f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1000,900",
        path.as_uri(),
    )  # fmt: skip
    assert result.returncode == 0 and shot.exists(), result.stderr.decode()[-2000:]
    image = Image.open(io.BytesIO(shot.read_bytes())).convert("RGB")
    assert image.size == (1000, 900)
    pixels = torch.tensor(list(image.getdata()), dtype=torch.float32)
    # A blank page is one colour; the page has text, the image, the coloured tokens and the plot
    assert pixels.std(0).mean() > 20
    colours = {tuple(p) for p in image.resize((250, 225)).getdata()}
    assert len(colours) > 50
    # The selection colours appear in the screenshot (both, VEPO only; anti-aliasing aside, exact fills)
    exact = set(image.getdata())
    assert (0xC6, 0xB2, 0xEE) in exact or (0xA9, 0xD1, 0xF7) in exact

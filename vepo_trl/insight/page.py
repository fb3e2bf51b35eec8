"""One self-contained HTML page of selection records: every completion token coloured by which rule selects it.

No network at view time: the image is a `data:` URI, the signal plot inline SVG, the styles and the small tooltip
script inline. Each completion token is one `<span class="tok">` carrying its values in `data-*` attributes (and a
`title`, so they show without script too); the legend says what the colours mean.
"""

from __future__ import annotations

import html
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .records import SelectionRecord, image_to_data_uri


# Control characters (NUL, ESC, ...) a tokenizer can emit: raw in the page they are invalid HTML and invisible
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _escape(text: str, quote: bool = True) -> str:
    """HTML-escaped text with control characters written out as visible backslash-x escapes (NUL as \\x00)."""
    return _CONTROL.sub(lambda match: f"\\x{ord(match[0]):02x}", html.escape(text, quote=quote))


__all__ = ["SELECTION_CLASSES", "render_page", "signal_plot_svg", "write_page"]

# class -> (legend label, background colour). Blue and orange stay apart for colour-blind readers; purple is both.
SELECTION_CLASSES = {
    "both": ("both", "#c6b2ee"),
    "run": ("{run} only", "#a9d1f7"),
    "entropy": ("top-k entropy only", "#ffcf99"),
    "none": ("neither", "transparent"),
}
_LINE_COLOURS = {"entropy": "#555555", "jsd": "#1f6fc5", "entropy_gap": "#c0392b"}
_PANEL_LABELS = {"entropy": "H (entropy)", "jsd": "JSD", "entropy_gap": "|dH|"}


def _run_label(strategy: str) -> str:
    return "VEPO" if strategy == "vepo" else f"selection ({strategy})"


def _fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.4f}"


def _token_class(selected: bool, entropy: bool) -> str:
    if selected and entropy:
        return "both"
    if selected:
        return "run"
    if entropy:
        return "entropy"
    return "none"


def _image_src(image: str | None) -> str | None:
    if not image:
        return None
    if image.startswith("data:"):
        return image
    path = Path(image)
    if path.is_file():
        from PIL import Image

        with Image.open(path) as opened:
            return image_to_data_uri(opened)
    return None


# ---------------------------------------------------------------------------------------------------------------------
# The signal plot
# ---------------------------------------------------------------------------------------------------------------------


def signal_plot_svg(record: SelectionRecord, *, width: int = 900, panel_height: int = 70) -> str:
    """Inline SVG: one panel per signal (H, JSD, |dH|) along the response, dots on the tokens the run selects (filled)
    and top-k entropy selects (ring), coloured like the token text."""
    panels = [("entropy", record.entropy)]
    if record.jsd is not None:
        panels += [("jsd", record.jsd), ("entropy_gap", record.entropy_gap)]
    n = max(record.num_tokens, 1)
    left, right, gap = 62, 10, 14
    plot_width = width - left - right
    height = len(panels) * (panel_height + gap) + 22

    def x(i: int) -> float:
        return left + (plot_width * (i + 0.5) / n)

    parts = [
        f'<svg class="signal-plot" viewBox="0 0 {width} {height}" width="100%" preserveAspectRatio="xMinYMin meet" '
        f'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="Signals along the response">'
    ]
    for p, (name, values) in enumerate(panels):
        top = p * (panel_height + gap) + 4
        finite = [v for v in values if v is not None and math.isfinite(v)]
        # Each panel spans its own range: H sits near ln V on a real model, and only its variation matters here
        vmax = max(finite) if finite else 1.0
        vmin = min(finite) if finite else 0.0
        span = (vmax - vmin) or 1.0

        def y(v: float, top=top, vmin=vmin, span=span) -> float:
            return top + panel_height - (panel_height * (v - vmin) / span)

        parts.append(
            f'<rect x="{left}" y="{top}" width="{plot_width}" height="{panel_height}" fill="#fafafa" stroke="#ddd"/>'
        )
        parts.append(
            f'<text x="{left - 6}" y="{top + 11}" text-anchor="end" class="axis">{_escape(f"{vmax:.3g}")}</text>'
            f'<text x="{left - 6}" y="{top + panel_height}" text-anchor="end" class="axis">{_escape(f"{vmin:.3g}")}</text>'
            f'<text x="{left - 6}" y="{top + panel_height / 2 + 4}" text-anchor="end" class="label">'
            f"{_escape(_PANEL_LABELS[name])}</text>"
        )
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values) if v is not None)
        parts.append(
            f'<polyline points="{points}" fill="none" stroke="{_LINE_COLOURS[name]}" stroke-width="1.3" '
            f'data-signal="{name}"/>'
        )
        for i, v in enumerate(values):
            if v is None:
                continue
            cls = _token_class(record.selected[i], record.entropy_top_k[i])
            if cls == "none":
                continue
            colour = SELECTION_CLASSES[cls][1]
            if record.selected[i]:
                parts.append(
                    f'<circle class="mark mark-{cls}" cx="{x(i):.1f}" cy="{y(v):.1f}" r="3.2" fill="{colour}" '
                    f'stroke="#333" stroke-width="0.6" data-i="{i}"/>'
                )
            else:
                parts.append(
                    f'<circle class="mark mark-{cls}" cx="{x(i):.1f}" cy="{y(v):.1f}" r="3.2" fill="none" '
                    f'stroke="#e07b00" stroke-width="1.4" data-i="{i}"/>'
                )
    bottom = len(panels) * (panel_height + gap) + 4
    step = max(1, round(n / 10 / 5) * 5) if n > 20 else max(1, n // 10 or 1)
    for i in range(0, n, step):
        parts.append(f'<text x="{x(i):.1f}" y="{bottom + 6}" text-anchor="middle" class="axis">{i}</text>')
    parts.append(f'<text x="{left + plot_width}" y="{bottom + 16}" text-anchor="end" class="axis">token</text>')
    parts.append(
        f'<line class="cursor" x1="-10" x2="-10" y1="2" y2="{bottom - gap + 2}" stroke="#000" stroke-width="1" '
        f'stroke-dasharray="3,2" visibility="hidden" data-left="{left}" data-width="{plot_width}" data-n="{n}"/>'
    )
    parts.append("</svg>")
    return "".join(parts)


# ---------------------------------------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------------------------------------

_STYLE = """
body{font:14px/1.45 -apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:#222;margin:0;background:#f3f4f6}
main{max-width:1100px;margin:0 auto;padding:18px 22px 40px}
h1{font-size:22px;margin:4px 0 2px} h2{font-size:17px;margin:0 0 8px}
.sub{color:#666;margin:0 0 12px}
.settings{display:flex;flex-wrap:wrap;gap:4px 18px;margin:6px 0 12px;font-size:13px}
.settings .key{color:#666;margin-right:4px}
.legend{display:flex;flex-wrap:wrap;gap:14px;align-items:center;background:#fff;border:1px solid #ddd;border-radius:6px;
 padding:8px 12px;position:sticky;top:0;z-index:5}
.legend .swatch{display:inline-block;width:28px;height:16px;border:1px solid #999;border-radius:3px;vertical-align:middle;margin-right:5px}
.legend .jsdmark{border:none;border-bottom:2px dotted #1f6fc5;height:12px}
.group{background:#fff;border:1px solid #ddd;border-radius:8px;padding:14px 16px;margin:16px 0}
.prompt{display:flex;gap:16px;align-items:flex-start;margin-bottom:10px}
.prompt img{max-width:280px;max-height:280px;border:1px solid #ccc;border-radius:4px;image-rendering:auto}
.question{white-space:pre-wrap;flex:1}
.completion{border-top:1px solid #eee;padding:10px 0 4px}
.meta{font-size:12.5px;color:#555;margin-bottom:6px} .meta b{color:#222}
.tokens{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:13px;white-space:pre-wrap;
 word-break:break-word;line-height:1.75;background:#fcfcfc;border:1px solid #eee;border-radius:4px;padding:8px}
.tok{border-radius:2px;padding:1px 0;cursor:default}
.tok.sel-both{background:#c6b2ee} .tok.sel-run{background:#a9d1f7} .tok.sel-entropy{background:#ffcf99}
.tok.topjsd{border-bottom:2px dotted #1f6fc5}
.tok:empty::before{content:"\\00b7";color:#bbb}
.tok.special{color:#888;font-style:italic}
.tok:hover,.tok.hl{outline:2px solid #222}
.signal-plot{display:block;margin-top:8px;max-width:100%}
.signal-plot .axis{font-size:10px;fill:#666} .signal-plot .label{font-size:11px;fill:#333}
#tip{position:fixed;display:none;pointer-events:none;background:#1f2328;color:#fff;font:12px/1.4 ui-monospace,Menlo,Consolas,monospace;
 padding:6px 9px;border-radius:5px;z-index:10;white-space:pre;box-shadow:0 2px 8px rgba(0,0,0,.25)}
.summary{border-collapse:collapse;font-size:13px;margin:8px 0} .summary th,.summary td{border:1px solid #ddd;padding:3px 8px;text-align:right}
.summary th{background:#f6f6f6}
"""

_SCRIPT = """
(function(){
  var tip=document.getElementById('tip');
  var wired=0;
  function fmt(v){return v===undefined||v===''?'n/a':v;}
  document.querySelectorAll('.tok').forEach(function(el){
    el.addEventListener('mouseenter',function(){
      var d=el.dataset;
      tip.textContent='token '+d.i+'  '+JSON.stringify(el.textContent)+'\\n'+
        'JSD   '+fmt(d.jsd)+'\\n|dH|  '+fmt(d.dh)+'\\nH     '+fmt(d.h)+'\\nH\\'    '+fmt(d.hq)+'\\nscore '+fmt(d.score)+
        '\\n'+d.label;
      tip.style.display='block';
      var svg=el.closest('.completion').querySelector('.cursor');
      if(svg){var l=+svg.dataset.left,w=+svg.dataset.width,n=+svg.dataset.n,x=l+w*(+d.i+0.5)/n;
        svg.setAttribute('x1',x);svg.setAttribute('x2',x);svg.setAttribute('visibility','visible');}
    });
    el.addEventListener('mousemove',function(e){tip.style.left=(e.clientX+14)+'px';tip.style.top=(e.clientY+14)+'px';});
    el.addEventListener('mouseleave',function(){tip.style.display='none';
      var svg=el.closest('.completion').querySelector('.cursor');if(svg){svg.setAttribute('visibility','hidden');}});
    wired++;
  });
  // How many tokens carry a tooltip: a check (and a test) that the script ran to its end
  document.body.dataset.tooltips=wired;
})();
"""


def _is_special(piece: str, token_id: int, special_ids: set[int]) -> bool:
    return token_id in special_ids or (piece.startswith("<|") and piece.endswith("|>"))


def _token_spans(record: SelectionRecord, run_label: str, special_ids: set[int]) -> str:
    spans = []
    for i, piece in enumerate(record.tokens):
        cls = _token_class(record.selected[i], record.entropy_top_k[i])
        classes = ["tok", f"sel-{cls}"]
        if record.jsd_top_k is not None and record.jsd_top_k[i]:
            classes.append("topjsd")
        if _is_special(piece, record.token_ids[i], special_ids):
            classes.append("special")
        values = {
            "jsd": record.jsd[i] if record.jsd is not None else None,
            "dh": record.entropy_gap[i] if record.entropy_gap is not None else None,
            "h": record.entropy[i],
            "hq": record.perturbed_entropy[i] if record.perturbed_entropy is not None else None,
            "score": record.score[i] if record.score is not None else None,
        }
        picked = [run_label] if record.selected[i] else []
        if record.entropy_top_k[i]:
            picked.append("top-k entropy")
        if record.jsd_top_k is not None and record.jsd_top_k[i]:
            picked.append("top-k JSD")
        label = "selected by: " + (", ".join(picked) if picked else "none")
        title = (
            f"JSD {_fmt(values['jsd'])} | |dH| {_fmt(values['dh'])} | H {_fmt(values['h'])} | "
            f"score {_fmt(values['score'])} | {label}"
        )
        data = " ".join(f'data-{key}="{_fmt(value)}"' for key, value in values.items())
        spans.append(
            f'<span class="{" ".join(classes)}" data-i="{i}" data-id="{record.token_ids[i]}" {data} '
            f'data-label="{_escape(label)}" title="{_escape(title)}">{_escape(piece)}</span>'
        )
    return "".join(spans)


def _record_stats(record: SelectionRecord) -> dict[str, Any]:
    n = record.num_tokens
    selected = sum(record.selected)
    entropy = sum(record.entropy_top_k)
    both = sum(s and e for s, e in zip(record.selected, record.entropy_top_k))
    stats: dict[str, Any] = {"tokens": n, "selected": selected, "entropy_top_k": entropy, "both": both}
    if record.jsd_top_k is not None:
        top = sum(record.jsd_top_k)
        stats["jsd_top_k"] = top
        stats["jsd_missed_by_entropy"] = sum(j and not e for j, e in zip(record.jsd_top_k, record.entropy_top_k))
        stats["jsd_missed_by_run"] = sum(j and not s for j, s in zip(record.jsd_top_k, record.selected))
    return stats


def _meta_line(record: SelectionRecord, index: int, run_label: str) -> str:
    stats = _record_stats(record)
    bits = [f"<b>completion {index}</b>"]
    if record.reward is not None:
        bits.append(f"reward <b>{record.reward:.3f}</b>")
    if record.advantage is not None:
        bits.append(f"advantage {record.advantage:+.3f}")
    if record.step is not None:
        bits.append(f"step {record.step}")
    bits.append(f"{stats['tokens']} tokens")
    bits.append(f"{run_label}: {stats['selected']}")
    bits.append(f"top-k entropy: {stats['entropy_top_k']}")
    bits.append(f"both: {stats['both']}")
    if "jsd_top_k" in stats and stats["jsd_top_k"]:
        bits.append(
            f"of the {stats['jsd_top_k']} top-k JSD tokens, top-k entropy misses {stats['jsd_missed_by_entropy']}, "
            f"{run_label} misses {stats['jsd_missed_by_run']}"
        )
    extra = record.meta.get("rewards")
    if isinstance(extra, Mapping):
        bits.append(
            " ".join(
                f"{_escape(str(k))} {v:.3g}" if isinstance(v, float) else f"{_escape(str(k))} {v}"
                for k, v in extra.items()
            )
        )
    return " &middot; ".join(bits)


def _group_key(record: SelectionRecord) -> tuple:
    return (record.step, record.group, record.prompt, record.image)


def _settings_rows(records: Sequence[SelectionRecord], settings: Mapping[str, Any] | None) -> str:
    first = records[0]
    rows: dict[str, Any] = {"strategy": first.strategy, "k": first.k, "alpha": first.alpha}
    for key in ("model", "perturbation", "noise_step", "noise_sigma", "patch_probability", "temperature", "source"):
        if key in first.meta:
            rows[key] = first.meta[key]
    rows.update(settings or {})
    steps = sorted({r.step for r in records if r.step is not None})
    if steps:
        rows["steps"] = ", ".join(str(s) for s in steps[:20]) + (" ..." if len(steps) > 20 else "")
    rows["completions"] = len(records)
    return "".join(
        f'<span><span class="key">{_escape(str(key))}</span>{_escape(str(value))}</span>'
        for key, value in rows.items()
    )


def _summary_table(records: Sequence[SelectionRecord], run_label: str) -> str:
    totals = {
        "tokens": 0,
        "selected": 0,
        "both": 0,
        "jsd_top_k": 0,
        "jsd_missed_by_entropy": 0,
        "jsd_missed_by_run": 0,
    }
    for record in records:
        for key, value in _record_stats(record).items():
            if key in totals:
                totals[key] += value
    cells = [
        ("completions", len(records)),
        ("tokens", totals["tokens"]),
        (f"{run_label} selects", f"{totals['selected'] / max(totals['tokens'], 1):.1%}"),
        ("overlap with top-k entropy", f"{totals['both'] / max(totals['selected'], 1):.1%}"),
    ]
    if totals["jsd_top_k"]:
        cells += [
            ("top-k JSD missed by top-k entropy", f"{totals['jsd_missed_by_entropy'] / totals['jsd_top_k']:.1%}"),
            (f"top-k JSD missed by {run_label}", f"{totals['jsd_missed_by_run'] / totals['jsd_top_k']:.1%}"),
        ]
    head = "".join(f"<th>{_escape(name)}</th>" for name, _ in cells)
    body = "".join(f"<td>{_escape(str(value))}</td>" for _, value in cells)
    return f'<table class="summary" id="summary"><tr>{head}</tr><tr>{body}</tr></table>'


def render_page(
    records: Sequence[SelectionRecord],
    *,
    title: str = "VEPO token selection",
    settings: Mapping[str, Any] | None = None,
    special_ids: Sequence[int] = (),
) -> str:
    """The HTML page of `records`: completions of the same prompt (and step) grouped under their image and question,
    in the order given. `settings` adds rows to the settings table (model, data source...)."""
    if not records:
        raise ValueError("No records to render.")
    run_label = _run_label(records[0].strategy)
    special = set(int(i) for i in special_ids)
    groups: dict[tuple, list[SelectionRecord]] = {}
    for record in records:
        groups.setdefault(_group_key(record), []).append(record)
    k = records[0].k
    legend_items = []
    for cls, (label, colour) in SELECTION_CLASSES.items():
        label = label.format(run=run_label)
        legend_items.append(
            f'<span class="legend-item" data-class="{cls}"><span class="swatch" style="background:{colour}"></span>'
            f"{_escape(label)}</span>"
        )
    legend_items.append(
        '<span class="legend-item" data-class="topjsd"><span class="swatch jsdmark"></span>top-k JSD (dotted)</span>'
    )
    legend_items.append(
        '<span class="legend-note">plot: filled dot = selected by '
        f"{_escape(run_label)}, orange ring = top-k entropy only</span>"
    )
    legend = f'<div class="legend" id="legend"><b>k = {k:g}</b>{"".join(legend_items)}</div>'

    sections = []
    for number, ((step, _group, prompt, image), members) in enumerate(groups.items()):
        src = _image_src(image)
        image_html = f'<img src="{src}" alt="prompt image">' if src else ""
        heading = f"Prompt {number + 1}" + (f" (step {step})" if step is not None else "")
        rewards = [r.reward for r in members if r.reward is not None]
        if rewards:
            heading += f" &middot; mean reward {sum(rewards) / len(rewards):.3f} over {len(rewards)}"
        completions = []
        for index, record in enumerate(members):
            completions.append(
                f'<div class="completion" data-tokens="{record.num_tokens}">'
                f'<div class="meta">{_meta_line(record, index, run_label)}</div>'
                f'<div class="tokens">{_token_spans(record, run_label, special)}</div>'
                f"{signal_plot_svg(record)}</div>"
            )
        sections.append(
            f'<section class="group"><h2>{heading}</h2><div class="prompt">{image_html}'
            f'<div class="question">{_escape(prompt)}</div></div>{"".join(completions)}</section>'
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{_escape(title)}</title>'
        f"<style>{_STYLE}</style></head><body><main><h1>{_escape(title)}</h1>"
        '<p class="sub">Each completion token is coloured by whether the run\'s selection, top-k entropy, both or '
        "neither keep it for the policy gradient. Hover a token for its signals (nats).</p>"
        f'<div class="settings" id="settings">{_settings_rows(records, settings)}</div>{legend}'
        f"{_summary_table(records, run_label)}{''.join(sections)}</main>"
        f'<div id="tip"></div><script>{_SCRIPT}</script></body></html>\n'
    )


def write_page(path: str | os.PathLike, records: Sequence[SelectionRecord], **kwargs) -> Path:
    """Render `records` (see `render_page`) to `path`; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_page(records, **kwargs), encoding="utf-8")
    return path

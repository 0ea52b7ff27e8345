"""Reading report.html as headless Chromium lays it out (the Debian package): the DOM
after rendering, and the geometry of the inline SVG (tick positions, marker positions),
so a test can say "the divergence line sits on step 4's tick"."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NO_CHROMIUM = "chromium is not installed (make system-deps, or apt-get install -y chromium)"


def dom(path: Path) -> str:
    out = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def section(page: str, elem_id: str, end: str = "</figure>") -> str:
    start = page.index(f'id="{elem_id}"')
    return page[start:page.index(end, start)]


def ticks(svg: str, axis: str) -> dict[str, float]:
    """Tick label -> tick position (px) of the figure's first axes."""
    axes = svg.split('id="axes_2"')[0]
    out = {}
    for block in axes.split(f'id="{axis}tick_')[1:]:
        pos = re.search(rf'<use [^>]*\b{axis}="([-\d.]+)"', block)
        label = re.search(r">([^<>]+)</text>", block)
        if pos and label:
            out[label.group(1).strip()] = float(pos.group(1))
    return out


def path_xy(svg: str, gid: str) -> tuple[float, float]:
    """Centre of the first path (or marker) drawn by the artist with id ``gid``."""
    block = svg[svg.index(f'id="{gid}"'):][:3000]
    use = re.search(r'<use [^>]*\bx="([-\d.]+)"[^>]*\by="([-\d.]+)"', block)
    d = re.search(r'\bd="([^"]+)"', block)
    if use and (not d or block.index(use.group(0)) < block.index(d.group(0)) or "<defs>" in block[:200]):
        return float(use.group(1)), float(use.group(2))
    nums = [float(v) for v in re.findall(r"[-\d.]+", d.group(1))]
    xs, ys = nums[0::2], nums[1::2]
    return (min(xs) + max(xs)) / 2, (min(ys) + max(ys)) / 2


def cells(page: str, table_id: str, rank: int | str) -> list[str]:
    """The recorded values (data-value) of one rank's row of a table."""
    table = section(page, table_id, "</table>")
    row = re.search(rf'<tr class="[^"]*" data-rank="{rank}">(.*?)</tr>', table, re.S)
    assert row, f"{table_id}: no row for rank {rank}"
    return re.findall(r'data-value="([^"]*)"', row.group(1))


def check_verdict_marks(page: str, rank: int, step: int) -> None:
    """The verdict's rank and step are stated, outlined on the heatmap at that tick and
    row, and marked by the divergence line on both curves."""
    assert f'<strong id="first-rank">{rank}</strong>' in page and f'<strong id="first-step">{step}</strong>' in page
    heat = section(page, "heatmap")
    xt, yt = ticks(heat, "x"), ticks(heat, "y")
    steps = [int(s) for s in xt]
    assert steps == list(range(steps[0], steps[-1] + 1)) and step in steps, f"every step to the verdict: {steps}"
    x, y = path_xy(heat, "first-divergence")
    assert abs(x - xt[str(step)]) < 1.0 and abs(y - yt[str(rank)]) < 1.0
    assert ">step</text>" in heat and ">rank</text>" in heat, "axis titles"
    assert 'id="axes_2"' in heat, "a colour bar beside the heatmap"
    for metric in ("loss", "grad_norm"):
        svg = section(page, f"curve-{metric}")
        mx, _ = path_xy(svg, "divergence-marker")
        assert abs(mx - ticks(svg, "x")[str(step)]) < 1.0, f"{metric}: marker not at step {step}"
        assert f'id="curve-r{rank}"' in svg

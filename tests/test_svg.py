"""The SVG picture of an sGraph: every kernel, block op and map annotation is in it, it is the
same bytes for the same sGraph, names are escaped, and the CLI writes it."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from typer.testing import CliRunner

from superopt import sgraph_schema, workloads
from superopt.build import unfused_baseline
from superopt.cli import app
from superopt.costmodel import is_free
from superopt.sgraph import GraphKernel, SGraph
from superopt.svg import render_svg

NS = "{http://www.w3.org/2000/svg}"
TAGS = {"svg", "defs", "marker", "path", "rect", "line", "g", "title", "text"}  # all the picture ever draws
runner = CliRunner()


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{NS}svg"
    return root


def groups(root: ET.Element, cls: str) -> list[ET.Element]:
    """The <g> elements whose class list holds `cls`, in document order."""
    return [g for g in root.iter(f"{NS}g") if cls in g.get("class", "").split()]


def texts(el: ET.Element, cls: str) -> list[str]:
    return [t.text or "" for t in el.iter(f"{NS}text") if cls in t.get("class", "").split()]


def check_picture(sg: SGraph, svg: str) -> None:
    """Every kernel (of its kind), every tensor, every block input (with imap and fmap), block op,
    accumulator and block output (with omap) of `sg` is drawn, once."""
    root = parse(svg)
    assert {el.tag.removeprefix(NS) for el in root.iter()} <= TAGS
    kernels = groups(root, "kernel")
    assert [g.get("data-name") for g in kernels] == [k.id for k in sg.kernels]
    assert [g.get("id") for g in kernels] == [f"kernel-{i}" for i in range(len(sg.kernels))]
    for g, k in zip(kernels, sg.kernels, strict=True):
        kind = "graph-kernel" if isinstance(k, GraphKernel) else "free-kernel" if is_free(sg, k) else "library-kernel"
        assert kind in g.get("class", "").split(), (k.id, g.get("class"))
        if not isinstance(k, GraphKernel):
            assert f"{k.id} · " in " ".join(texts(g, "kernel-title")) and texts(g, "kernel-op")[0].startswith(k.op)
            continue
        b = k.block
        assert texts(g, "grid") and all(a.name in texts(g, "grid")[0] for a in b.axes)
        inputs = groups(g, "block-input")
        assert [i.get("data-name") for i in inputs] == [i.id for i in b.inputs]
        for el in inputs:
            assert len(texts(el, "imap")) == 1 and texts(el, "imap")[0].startswith("grid: ")
            assert len(texts(el, "fmap")) == 1 and texts(el, "fmap")[0].startswith("loop: ")
        assert [o.get("data-name") for o in groups(g, "body-op")] == [op.id for op in b.body]
        assert [o.get("data-name") for o in groups(g, "post-op")] == [op.id for op in b.post]
        assert [o.get("data-name") for o in groups(g, "accumulator")] == [a.id for a in b.accumulators]
        outputs = groups(g, "block-output")
        assert [o.get("data-name") for o in outputs] == [o.tensor for o in b.outputs]
        for el in outputs:
            assert len(texts(el, "omap")) == 1 and texts(el, "omap")[0].startswith("write: split ")
        assert len(groups(g, "loop-frame")) == 1
    tensors = [t.id for t in sg.inputs] + [t for k in sg.kernels for t in k.outputs]
    assert [g.get("data-name") for g in groups(root, "tensor")] == tensors
    assert [g.get("data-name") for g in groups(root, "output")] == list(sg.outputs)
    edges = [(k.id, t) for k in sg.kernels for t in dict.fromkeys(k.tensor_inputs)] + [
        (k.id, t) for k in sg.kernels for t in k.outputs]
    assert len(groups(root, "tensor-edge")) == len(edges)


@pytest.mark.parametrize("name", list(workloads.WORKLOADS))
def test_every_kernel_op_and_map_of_the_builtin_workloads_is_drawn(name: str) -> None:
    program, reference = workloads.reference_for(name)
    for sg in (reference, unfused_baseline(program)):
        check_picture(sg, render_svg(sg))


def test_maps_read_as_words_and_sizes_show_their_values_when_instantiated() -> None:
    _, sg = workloads.reference_for("rmsnorm_matmul")
    symbolic = parse(render_svg(sg))
    (w,) = [g for g in groups(symbolic, "block-input") if g.get("data-name") == "W_t"]
    assert texts(w, "imap") == ["grid: split cols over gx"] and texts(w, "fmap") == ["loop: walk rows by F"]
    (x,) = [g for g in groups(symbolic, "block-input") if g.get("data-name") == "X_t"]
    assert texts(x, "imap") == ["grid: every block reads all of it"]
    assert texts(symbolic, "omap") == ["write: split cols over gx"]
    assert texts(symbolic, "grid") == ["grid x: gx · loop f: F"]
    assert "each of 4096/F, 6144/gx must be an integer" in texts(symbolic, "constraints")

    root = parse(render_svg(sg, {"gx": 48, "F": 4}))
    assert texts(root, "grid") == ["grid x: gx=48 · loop f: F=4"]
    assert texts(root, "launch") == ["48 blocks × 4 iterations"]
    assert texts(root, "params") == ["launch parameters: F=4, gx=48"]
    (w,) = [g for g in groups(root, "block-input") if g.get("data-name") == "W_t"]
    assert texts(w, "imap") == ["grid: split cols over gx=48"]
    assert texts(w, "tile") == ["(4096/F=1024, 6144/gx=128) smem f16"]
    _, gqa = workloads.reference_for("gqa")
    (k_in,) = [g for g in groups(parse(render_svg(gqa)), "block-input") if g.get("data-name") == "K_t"]
    assert texts(k_in, "imap") == ["grid: split dim 0 over gx, cols over gz; same for every y"]
    assert texts(k_in, "fmap") == ["loop: walk cols by F within the block's part"]


def test_the_same_sgraph_gives_the_same_bytes() -> None:
    """Also after a JSON round trip and in other processes (whatever their string hashing)."""
    program, sg = workloads.reference_for("gqa")
    svg = render_svg(sg, {"gx": 2, "gy": 8, "gz": 8, "F": 2, "hx": 1, "hy": 8})
    assert svg == render_svg(SGraph.loads(sg.dumps()), {"gx": 2, "gy": 8, "gz": 8, "F": 2, "hx": 1, "hy": 8})
    script = ("from superopt import workloads; from superopt.build import unfused_baseline; "
              "from superopt.svg import render_svg; import sys; p, sg = workloads.reference_for('gqa'); "
              "sys.stdout.write(render_svg(sg) + render_svg(unfused_baseline(p)))")
    runs = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert runs == {render_svg(sg) + render_svg(unfused_baseline(program))}


def _renamed_json(data: Any, names: dict[str, str]) -> Any:
    """The sGraph JSON with every name in `names` replaced wherever it occurs (schema, kinds, ops,
    dtypes and sizes are not names and do not clash with these)."""
    if isinstance(data, dict):
        return {k: v if k in ("schema", "kind", "op", "dtype", "size") else _renamed_json(v, names)
                for k, v in data.items()}
    if isinstance(data, list):
        return [_renamed_json(v, names) for v in data]
    return names.get(data, data) if isinstance(data, str) else data


HOSTILE = {
    "lora.fused": '<svg onload="alert(1)">',
    "X": "X</text><script>alert(1)</script>",
    "D": "D & <D> ]]> <!-- -->",
    "k1": "k1\"' &amp; &#60;",
    "b1": "b1\x00\n\r\u2028<",
    "acc4": "acc\u202e4&",
    "x": "<x/>",
    "W_t": "W" * 200,
}


def test_names_are_escaped_and_never_markup() -> None:
    _, sg = workloads.reference_for("lora")
    # Built past the name checks of sGraph JSON, which refuse these names: an SGraph made in
    # Python, through the API, follows no grammar.
    with mock.patch.multiple(sgraph_schema, name_problem=lambda _: None, sgraph_name_problem=lambda _: None):
        hostile = SGraph.from_json(_renamed_json(sg.to_json(), HOSTILE))
    svg = render_svg(hostile)
    markup_names = {HOSTILE[n] for n in ("X", "D", "k1", "x")}
    for name in markup_names:
        assert name not in svg  # every one holds < or &: never written raw
    root = parse(svg)  # well-formed: the names made no element, comment or CDATA section
    assert {el.tag.removeprefix(NS) for el in root.iter()} <= TAGS
    assert [g.get("data-name") for g in groups(root, "kernel")] == ["k0", HOSTILE["k1"]]
    assert HOSTILE["X"] in [g.get("data-name") for g in groups(root, "tensor")]
    assert any(HOSTILE["D"] in t.text for t in root.iter(f"{NS}title") if t.text)
    assert texts(root, "title") == ['sGraph <svg onload="alert(1)">']
    # control, bidi and line-separator characters are spelled out, not written
    ops = {g.get("data-name") for g in groups(root, "block-op")}
    assert "b1\\x00\\x0a\\x0d\\u2028<" in ops
    assert "acc\\u202e4&" in {g.get("data-name") for g in groups(root, "accumulator")}
    assert not any(c in svg for c in "\x00\r\u2028\u202e")
    # a long name is shortened where it is drawn and whole in its <title>
    (w,) = [g for g in groups(root, "block-input") if g.get("data-name") == "W" * 200]
    assert w.find(f"{NS}title").text == "W" * 200
    assert all(len(t) < 80 for t in texts(w, "op-name"))


def test_cli_show_and_optimize_write_svg_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path / "cache"))  # kept sGraphs and keys stay in tmp_path
    def run(*args: str) -> ET.Element:
        out = tmp_path / f"{len(list(tmp_path.glob('*.svg')))}.svg"
        res = runner.invoke(app, [*args, "--svg", str(out)])
        assert res.exit_code == 0, res.output
        assert f"wrote {out}" in res.stderr
        return parse(out.read_text())

    baseline = run("show", "gqa")  # a program is drawn as its unfused baseline
    assert len(groups(baseline, "library-kernel")) == 5 and not groups(baseline, "graph-kernel")
    reference = run("show", "gqa", "--reference", "--params", "gx=2,gy=8,gz=8,F=2,hx=1,hy=8")
    assert texts(reference, "grid")[0] == "grid x: gx=2, y: gy=8, z: gz=8 · loop f: F=2"
    sg_file = tmp_path / "sg.json"
    sg_file.write_text(workloads.reference_for("lora:ci")[1].dumps())
    assert len(groups(run("show", str(sg_file)), "graph-kernel")) == 1
    db = str(tmp_path / "cache.db")
    optimized = run("optimize", "ntrans:ci", "--target", "h100", "--db", db, "--budget-s", "60")
    assert "best schedule of ntrans:ci on h100" in texts(optimized, "caption")[0]
    winner = run("show", "ntrans:ci", "--winner", "--target", "h100", "--db", db)  # the cached winner
    assert texts(winner, "caption") == texts(optimized, "caption")
    res = runner.invoke(app, ["show", str(sg_file), "--winner"])
    assert res.exit_code == 2 and "--winner goes with a program" in res.stderr
    res = runner.invoke(app, ["show", "gqa", "--svg", str(tmp_path / "no" / "such" / "dir.svg")])
    assert res.exit_code == 2 and "cannot write" in res.stderr

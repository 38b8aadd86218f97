"""``layoutc review BASE..HEAD``: a Markdown report for a pull request touching layout specs.

For every ``.lyt`` file that changed between two git revisions: the semantic diff (what moved,
whether sync still holds), ``explain`` of the new version, and pictures (the transform graph,
and the layout of every tensor whose layout changed). Pictures go to a folder beside the report.
"""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path

from .api import compile_source
from .gitrepo import changed_specs, show, toplevel
from .diff import as_markdown as diff_markdown
from .diff import diff, load_pair
from .errors import SpecError
from .explain import as_markdown as explain_markdown
from .explain import explain
from .text import display


def review(rev_range: str, images: Path, cwd: Path = Path("."), report_dir: Path | None = None) -> tuple[str, bool]:
    """(Markdown report, whether every changed spec compiles and verifies). Picture links are
    relative to ``report_dir`` (where the report will be written) when given."""
    import os

    def link(p: Path) -> str:  # URL-quoted: a file name must not end the Markdown link early
        rel = Path(os.path.relpath(p, report_dir)).as_posix() if report_dir is not None else p.as_posix()
        return urllib.parse.quote(rel)

    def code(text: str) -> str:  # a file name as Markdown code, whatever it holds
        return "`" + display(text).replace("`", "'") + "`"

    from .draw import draw_graph, draw_layout

    if ".." not in rev_range:
        raise ValueError("give a range BASE..HEAD")
    base, head = rev_range.split("..", 1)
    head = head or "HEAD"
    top = toplevel(cwd)
    paths = changed_specs(base, head, top)
    lines = [f"## Layout review: `{base}..{head}`", ""]
    if not paths:
        return "\n".join(lines + ["No `.lyt` spec changed."]) + "\n", True
    images.mkdir(parents=True, exist_ok=True)
    ok = True
    for path in paths:
        new_text = show(head, path, top)
        old_text = show(base, path, top)
        lines += [f"### {code(path)}", ""]
        try:
            new = compile_source(new_text, f"{path}@{head}", verify_spec=False)
        except SpecError as err:
            ok = False
            lines += ["The new version does not compile:", "", "```", err.render(), "```", ""]
            continue
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", path.removesuffix(".lyt"))  # a picture name from any path
        if old_text is None:
            lines += ["New spec.", ""]
            changed_tensors = list(new.input_names)
        else:
            try:
                old, new = load_pair(old_text, f"{path}@{base}", new_text, f"{path}@{head}")
                d = diff(old, new)
                lines += [diff_markdown(d)]
                changed_tensors = [c.tensor for c in d.changes if c.tensor in new.input_names]
                ok &= not d.findings
            except SpecError as err:
                lines += [f"The old version does not compile ({err.errors[0].message}); showing the new one only.", ""]
                changed_tensors = list(new.input_names)
        try:
            verified = compile_source(new_text, f"{path}@{head}")
            lines += [explain_markdown(explain(verified))]
        except SpecError as err:
            ok = False
            lines += ["The new version fails verification:", "", "```", err.render(), "```", ""]
        graph = draw_graph(new, images / f"{stem}_graph.png")
        lines += [f"![transform graph]({link(graph)})", ""]
        drawn = set()
        for tensor in changed_tensors:
            chain = next(c for c in new.compiled.variants[-1].chains if c.tensor == tensor)
            weight = chain.source.tie.weight if chain.source.tie else tensor
            if weight in drawn:
                continue
            drawn.add(weight)
            pic = draw_layout(new, weight, images / f"{stem}_{weight}.png")
            lines += [f"![layout of {weight} and its tied tensors]({link(pic)})", ""]
    return "\n".join(lines) + "\n", ok

"""Refresh the llm-d config corpus (``tests/config/llmd_corpus/``) from checkouts of llm-d's repositories.

    python -m tests.config.llmd_corpus_refresh --repo llm-d/llm-d-router=PATH --repo llm-d/llm-d=PATH

Each entry of ``corpus.yaml`` names a repository, a path in it and how the ``EndpointPickerConfig`` is taken
from that file: ``whole`` (the file is the config), ``values: KEY`` (a Helm values file whose
``pluginsCustomConfig`` holds it under ``KEY``) or ``chart: KEY`` (the router chart's config template,
rendered with the chart's default values). For every repository given, each of its entries is read again at
the checkout's ``HEAD`` (``--rev`` to choose another revision), written with a header naming its source,
and its commit recorded; entries of repositories not given are left as they are. Expected outcomes are kept:
run the corpus test afterwards, and where an outcome changed, update it in ``corpus.yaml`` after reading why.
``PATH`` may be a work tree or a bare repository.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

CORPUS = Path(__file__).resolve().parent / "llmd_corpus"
INDEX = CORPUS / "corpus.yaml"
_VALUES_ROOTS = (("router", "epp"), ("inferenceExtension",), ("inferencePool",))

# What each condition of the router chart's config template is under the chart's default values
# (modelServers.type vllm, protocol http, no parsers, no latency predictor, no custom config).
_CHART_DEFAULT_CONDITIONS = {
    ".Values.router.latencyPredictor.enabled": False,
    ".Values.router.epp.parsers": False,
    ".Values.router.epp.pluginsCustomConfig": False,
    "$parsers": False,
    'and (eq (lower $modelServerType) "vllm") (eq (lower $modelServerProtocol) "grpc")': False,
    'eq (lower $modelServerType) "triton"': False,
    'ne $modelServerType "vllm"': False,
}
_ACTION = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}")
_DEFAULT_EXPR = re.compile(r'^\.Values\.[\w.]+ \| default ("[^"]*"|true|false|\d+)( \| quote)?$')


class RefreshError(Exception):
    """A corpus entry could not be read or rendered."""


def git_show(repo: Path, rev: str, path: str) -> tuple[str, str]:
    """The text of ``path`` at ``rev`` in the repository at ``repo``, and the commit ``rev`` names."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", f"{rev}^{{commit}}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        text = subprocess.run(
            ["git", "-C", str(repo), "show", f"{commit}:{path}"], check=True, capture_output=True, text=True
        ).stdout
    except subprocess.CalledProcessError as exc:
        raise RefreshError(f"{repo}: {path} at {rev}: {exc.stderr.strip()}") from None
    return text, commit


def from_values(text: str, key: str) -> str:
    """The config a Helm values file carries in ``...pluginsCustomConfig[key]``."""
    data = yaml.safe_load(text)
    for root in _VALUES_ROOTS:
        node: Any = data
        for part in root:
            node = node.get(part) if isinstance(node, Mapping) else None
        custom = node.get("pluginsCustomConfig") if isinstance(node, Mapping) else None
        if isinstance(custom, Mapping) and isinstance(custom.get(key), str):
            return str(custom[key])
    raise RefreshError(f"no pluginsCustomConfig entry {key!r}")


def render_chart_default(template: str, key: str) -> str:
    """The ``key`` entry of the router chart's config template, rendered with the chart's default values.

    Only the template constructs that entry uses are understood (``if``/``else if``/``else``/``end``,
    ``range`` over a list that is empty by default, variable assignments, ``.Values.x | default V``); any
    other construct or condition is an error, so a changed template is noticed rather than misread.
    """
    lines = _chart_block(template, key)
    out: list[str] = []
    stack: list[tuple[bool, bool]] = []  # (this branch is active, a branch of this if was taken)
    for line in lines:
        actions = _ACTION.findall(line)
        stripped = _ACTION.sub("", line).strip()
        if actions and not stripped:
            for action in actions:
                _control(action, stack)
            continue
        if not all(active for active, _ in stack):
            continue
        out.append(_ACTION.sub(lambda m: _expression(m.group(1)), line))
    if stack:
        raise RefreshError("unbalanced template block")
    return textwrap.dedent("\n".join(out)).strip() + "\n"


def _chart_block(template: str, key: str) -> list[str]:
    lines = template.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == f"{key}: |"), None)
    if start is None:
        raise RefreshError(f"no {key!r} in the chart template")
    indent = len(lines[start]) - len(lines[start].lstrip())
    block: list[str] = []
    for line in lines[start + 1 :]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        block.append(line)
    return block


def _control(action: str, stack: list[tuple[bool, bool]]) -> None:
    if action.startswith("$") and "=" in action:
        return  # a variable: the conditions that read one are known by their text
    if action.startswith("if "):
        value = _condition(action[3:])
        stack.append((value, value))
    elif action.startswith("else if "):
        _, taken = stack.pop()
        value = not taken and _condition(action[8:])
        stack.append((value, taken or value))
    elif action == "else":
        _, taken = stack.pop()
        stack.append((not taken, True))
    elif action.startswith("range "):
        stack.append((False, False))  # every list ranged over is empty by default
    elif action == "end":
        if not stack:
            raise RefreshError("'end' without a block")
        stack.pop()
    else:
        raise RefreshError(f"template action not understood: {action!r}")


def _condition(text: str) -> bool:
    if text not in _CHART_DEFAULT_CONDITIONS:
        raise RefreshError(f"template condition not known under default values: {text!r}")
    return _CHART_DEFAULT_CONDITIONS[text]


def _expression(text: str) -> str:
    match = _DEFAULT_EXPR.match(text)
    if match is None:
        raise RefreshError(f"template expression not understood: {text!r}")
    value, quote = match.group(1), match.group(2)
    if value.startswith('"'):
        value = value[1:-1]
        return f'"{value}"' if quote else value
    return f'"{value}"' if quote else value


def extract(entry: Mapping[str, Any], text: str) -> str:
    """The ``EndpointPickerConfig`` an entry takes from its source file's ``text``."""
    how = entry["extract"]
    if how == "whole":
        return text
    if isinstance(how, Mapping) and "values" in how:
        return from_values(text, str(how["values"]))
    if isinstance(how, Mapping) and "chart" in how:
        return render_chart_default(text, str(how["chart"]))
    raise RefreshError(f"unknown extract {how!r}")


def header(entry: Mapping[str, Any], commit: str) -> str:
    how = entry["extract"]
    if how == "whole":
        what = "copied as it is"
    elif "values" in how:
        what = f"the pluginsCustomConfig entry {how['values']!r} of this Helm values file"
    else:
        what = f"the {how['chart']!r} entry of this chart template, rendered with the chart's default values"
    return (
        f"# llm-d EndpointPickerConfig test data, {what}.\n"
        f"# source: https://github.com/{entry['repo']} {entry['path']} at commit {commit}\n"
        "# (llm-d is Apache-2.0 licensed; see the source repository.)\n"
    )


def write_entry(entry: Mapping[str, Any], text: str, commit: str, corpus: Path = CORPUS) -> None:
    body = extract(entry, text)
    (corpus / str(entry["file"])).write_text(header(entry, commit) + body, encoding="utf-8")


def refresh(repos: Mapping[str, Path], rev: str, corpus: Path = CORPUS) -> list[str]:
    """Re-read every entry of the given repositories; returns what was done, a line per entry."""
    index_path = corpus / "corpus.yaml"
    index = yaml.safe_load(index_path.read_text(encoding="utf-8"))
    done: list[str] = []
    for entry in index["entries"]:
        repo = repos.get(entry["repo"])
        if repo is None:
            continue
        text, commit = git_show(repo, rev, entry["path"])
        write_entry(entry, text, commit, corpus)
        if entry.get("commit") != commit:
            done.append(f"{entry['file']}: {entry.get('commit', '?')[:12]} -> {commit[:12]}")
        entry["commit"] = commit
    preamble = index_path.read_text(encoding="utf-8").split("\nentries:", 1)[0]
    body = yaml.safe_dump({"entries": index["entries"]}, sort_keys=False, width=1000, allow_unicode=True)
    index_path.write_text(preamble.rstrip() + "\n" + body, encoding="utf-8")
    return done


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repo",
        action="append",
        default=[],
        metavar="OWNER/NAME=PATH",
        help="a checkout of a source repository",
    )
    parser.add_argument("--rev", default="HEAD", help="the revision to read (default HEAD)")
    args = parser.parse_args(argv)
    repos: dict[str, Path] = {}
    for item in args.repo:
        name, sep, path = item.partition("=")
        if not sep:
            parser.error(f"--repo {item!r}: expected OWNER/NAME=PATH")
        repos[name] = Path(path)
    try:
        for line in refresh(repos, args.rev):
            print(line)
    except RefreshError as exc:
        print(f"refresh: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

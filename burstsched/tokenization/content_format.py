"""Whether a chat template reads message content as a string or as a list of parts, decided as vLLM does.

vLLM (``--chat-template-content-format auto``, the default) parses the template and looks for a loop over a
message's ``content`` (``{% for part in message['content'] %}``, also through variables assigned from
``messages`` and through macro parameters). Found: the ``openai`` format, where content stays a list of
``{"type": "text", "text": ...}`` parts; not found: the ``string`` format, where text parts are joined by
newlines. The two give different prompts for the same request, so the router must decide the same way.
This is a port of ``vllm/renderers/hf.py`` (``_detect_content_format`` and its helpers, vLLM 0.32).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Literal

import jinja2
import jinja2.nodes as nodes

ContentFormat = Literal["string", "openai"]


def detect_content_format(env: jinja2.Environment, source: str) -> ContentFormat:
    """``openai`` when the template iterates over a message's content, else ``string``."""
    try:
        root = env.parse(source)
        next(_content_loops(root))
    except StopIteration:
        return "string"
    except Exception:  # vLLM falls back to its default on any parse or walk error
        return "string"
    return "openai"


def _is_var_access(node: nodes.Node, varname: str) -> bool:
    return isinstance(node, nodes.Name) and node.ctx == "load" and node.name == varname


def _is_attr_access(node: nodes.Node, varname: str, key: str) -> bool:
    if isinstance(node, nodes.Getitem):
        return (
            _is_var_access(node.node, varname) and isinstance(node.arg, nodes.Const) and node.arg.value == key
        )
    if isinstance(node, nodes.Getattr):
        return _is_var_access(node.node, varname) and node.attr == key
    return False


def _is_var_or_elems_access(node: nodes.Node, varname: str, key: str | None = None) -> bool:
    if isinstance(node, nodes.Filter):
        return node.node is not None and _is_var_or_elems_access(node.node, varname, key)
    if isinstance(node, nodes.Test):
        return _is_var_or_elems_access(node.node, varname, key)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _is_var_or_elems_access(node.node, varname, key)
    return _is_attr_access(node, varname, key) if key else _is_var_access(node, varname)


def _assigned_names(root: nodes.Template, varname: str) -> Iterator[str]:
    """``varname`` and every variable assigned from it (or from its elements), transitively."""
    yield varname
    related = deque([varname])
    seen = {varname}
    while related:
        name = related.popleft()
        for assign in root.find_all(nodes.Assign):
            if _is_var_or_elems_access(assign.node, name):
                target = assign.target
                if not isinstance(target, nodes.Name):
                    raise TypeError("tuple assignment")  # vLLM asserts here and falls back to its default
                yield target.name
                if target.name not in seen:
                    seen.add(target.name)
                    related.append(target.name)


def _message_names(root: nodes.Template) -> Iterator[str]:
    """Loop variables of ``{% for message in messages %}`` loops (and loops over aliases of ``messages``)."""
    messages_names = list(_assigned_names(root, "messages"))
    for loop in root.find_all(nodes.For):
        for varname in messages_names:
            if _is_var_or_elems_access(loop.iter, varname):
                if not isinstance(loop.target, nodes.Name):
                    raise TypeError("tuple loop target")
                yield loop.target.name
                break


def _macro_content_params(
    root: nodes.Template, message_names: list[str]
) -> tuple[dict[int, set[str]], set[int]]:
    """Per loop inside a macro: the macro's parameters that receive ``message.content``; and those loops."""
    by_loop: dict[int, set[str]] = {}
    in_macros: set[int] = set()
    for macro in root.find_all(nodes.Macro):
        param_names = {arg.name for arg in macro.args}
        params: set[str] = set()
        for call in root.find_all(nodes.Call):
            if not (isinstance(call.node, nodes.Name) and call.node.name == macro.name):
                continue
            for i, arg in enumerate(call.args):
                if i < len(macro.args) and any(
                    _is_var_or_elems_access(arg, name, "content") for name in message_names
                ):
                    params.add(macro.args[i].name)
            for kwarg in call.kwargs:
                if kwarg.key in param_names and any(
                    _is_var_or_elems_access(kwarg.value, name, "content") for name in message_names
                ):
                    params.add(kwarg.key)
        for loop in macro.find_all(nodes.For):
            in_macros.add(id(loop))
            if params:
                by_loop[id(loop)] = params
    return by_loop, in_macros


def _content_loops(root: nodes.Template) -> Iterator[nodes.For]:
    """Loops over a message's content: ``message['content']``, a macro parameter bound to it, ``content``."""
    message_names = list(_message_names(root))
    by_loop, in_macros = _macro_content_params(root, message_names)
    for loop in root.find_all(nodes.For):
        if any(_is_var_or_elems_access(loop.iter, name, "content") for name in message_names):
            yield loop
            continue
        params = by_loop.get(id(loop))
        if isinstance(loop.iter, nodes.Name) and params is not None and loop.iter.name in params:
            yield loop
            continue
        if id(loop) not in in_macros and isinstance(loop.iter, nodes.Name) and loop.iter.name == "content":
            yield loop

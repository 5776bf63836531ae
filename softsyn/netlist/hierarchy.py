"""The design hierarchy: each node's module scope, from the exporter's name scopes or the node's name.

The scope is kept on the node as the metadata prop ``softsyn.hierarchy`` (HIERARCHY_KEY), so it survives a
save/load and passes can carry it over to the nodes they create.
"""
from __future__ import annotations

import ast
import re

import onnx_ir as ir

HIERARCHY_KEY = "softsyn.hierarchy"
_SCOPES_KEY = "pkg.torch.onnx.name_scopes"


def scope_from_name_scopes(raw: str, prefix: str = "m") -> str:
    """Deepest module scope of a dynamo-exported node, wrapper prefix stripped.

    "['', 'm', 'm.model', 'm.model.layers.0', 'm.model.layers.0.self_attn', 'linear_1']"
    -> "model.layers.0.self_attn".
    """
    try:
        scopes = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return ""
    if not isinstance(scopes, (list, tuple)):
        return ""
    scopes = scopes[:-1]  # the last entry is the node's own fx name, not a module
    deepest = ""
    for s in scopes:
        if not isinstance(s, str) or s == "" or s.startswith("_empty_nn_module_stack"):  # torch: no module
            continue
        if deepest == "" or s.startswith(deepest + "."):
            deepest = s
        else:
            break
    if prefix:
        if deepest != prefix and not deepest.startswith(prefix + "."):
            return ""
        if deepest == prefix:
            return ""
        if deepest.startswith(prefix + "."):
            return deepest[len(prefix) + 1 :]
    return deepest


_LEGACY_NAME = re.compile(r"^/(.+)/[^/]+$")


def scope_from_node_name(name: str | None) -> str:
    """Hierarchy from a legacy-exporter node name: "/model/layers.0/self_attn/q_proj/MatMul" -> "model.layers.0.self_attn.q_proj"."""
    if not name:
        return ""
    m = _LEGACY_NAME.match(name)
    if not m:
        return ""
    return ".".join(p for p in m.group(1).split("/") if p)


def node_scope(node: ir.Node, prefix: str = "m") -> str:
    """A node's scope from the exporter's name scopes if it has them, else from its legacy-exporter name."""
    raw = node.metadata_props.get(_SCOPES_KEY)
    if raw is not None:
        return scope_from_name_scopes(raw, prefix)
    return scope_from_node_name(node.name)


def annotate_hierarchy(model: ir.Model, prefix: str = "m") -> None:
    """Store each node's hierarchy in its metadata (``softsyn.hierarchy``) from the exporter's scopes."""
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if HIERARCHY_KEY in node.metadata_props:
            continue
        node.metadata_props[HIERARCHY_KEY] = node_scope(node, prefix)

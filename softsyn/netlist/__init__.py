"""The netlist: an onnx-ir model with its hierarchy, symbolic dims and shape binding (see model.Netlist)."""
from softsyn.netlist.dims import eval_dim_expr, expr_names
from softsyn.netlist.hierarchy import (HIERARCHY_KEY, annotate_hierarchy, node_scope, scope_from_name_scopes,
                                       scope_from_node_name)
from softsyn.netlist.model import NETLIST_META_KEY, Netlist

__all__ = [
    "Netlist",
    "NETLIST_META_KEY",
    "HIERARCHY_KEY",
    "annotate_hierarchy",
    "node_scope",
    "scope_from_name_scopes",
    "scope_from_node_name",
    "eval_dim_expr",
    "expr_names",
]

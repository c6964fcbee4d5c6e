"""Capacity planner: weight bytes, KV bytes per token and KV tokens per replica on a GPU type."""

from qverify.capacity.kv import KVLayout, kv_bytes_per_token, kv_layout
from qverify.capacity.planner import CapacityPlan, KVOption, plan
from qverify.capacity.quantplan import PLANNER_ONLY, QuantPlan, quant_plan
from qverify.capacity.weights import WeightsEstimate, checkpoint_weights, estimate_weights

__all__ = [
    "PLANNER_ONLY", "CapacityPlan", "KVLayout", "KVOption", "QuantPlan", "WeightsEstimate", "checkpoint_weights",
    "estimate_weights", "kv_bytes_per_token", "kv_layout", "plan", "quant_plan",
]

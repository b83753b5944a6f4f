"""Checked by ``make typecheck`` (mypy --strict), not run by pytest: each concrete class answers
the protocol its stage's neighbours type against, so a method renamed on one side fails here."""

from __future__ import annotations

from tokenbucket.cost.memory import CostModel
from tokenbucket.cost.profile import MeasuredCostModel
from tokenbucket.monitor.hooks import CameraTokens
from tokenbucket.plan._search import PredictsMemory, SupportsCost
from tokenbucket.testing import RandomTokens
from tokenbucket.train.batch import BucketedData
from tokenbucket.train.collate import MapDataset, TokenBucketDataset
from tokenbucket.train.shaping import ShapedData


def analytic_is_a_planner_cost(cost: CostModel) -> SupportsCost:
    return cost


def measured_predicts_memory(cost: MeasuredCostModel) -> PredictsMemory:
    return cost


def dataset_is_bucketed_data(data: TokenBucketDataset) -> BucketedData:
    return data


def dataset_answers_the_monitor(data: TokenBucketDataset) -> CameraTokens:
    return data


def torch_dataset_is_a_map_dataset(data: RandomTokens) -> MapDataset:
    return data


def dataset_is_shaped_data(data: TokenBucketDataset) -> ShapedData:
    return data

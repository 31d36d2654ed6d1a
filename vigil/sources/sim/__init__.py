"""Cluster simulator: nodes x GPUs, jobs x ranks, real exporter names, injected faults with ground truth."""

from vigil.sources.sim.generator import FaultPlan, SimConfig, SimRun, Tick, simulate

__all__ = ["FaultPlan", "SimConfig", "SimRun", "Tick", "simulate"]

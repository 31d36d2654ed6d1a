"""Actuators: the only code that changes anything outside Vigil. One interface, several back ends."""

from vigil.remedy.actuators.base import Actuator, ActuatorError

__all__ = ["Actuator", "ActuatorError"]

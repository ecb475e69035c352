"""Plan at scale: each strategy's collectives, bytes, memory and predicted
communication time per training step, from programs compiled for the mesh
(up to 2048 simulated devices, nothing allocated).

``python -m collectives plan --devices 2048`` prints the table;
:func:`plan` returns it. See the docs page "Choosing a strategy".
"""

from collectives.plan._model import DEFAULT_MODEL
from collectives.plan._model import MODELS
from collectives.plan._model import Model
from collectives.plan._model import model_from
from collectives.plan._plan import MAX_DEVICES
from collectives.plan._plan import PRECISIONS
from collectives.plan._plan import Plan
from collectives.plan._plan import PlanRow
from collectives.plan._plan import compile_units
from collectives.plan._plan import default_mesh
from collectives.plan._plan import plan
from collectives.plan._plan import plan_each
from collectives.plan._plan import planned_recipes
from collectives.plan._profiles import Link
from collectives.plan._profiles import Profile
from collectives.plan._profiles import load_profiles
from collectives.plan._profiles import measured_profile
from collectives.plan._profiles import read_profiles
from collectives.plan._targets import TARGETS
from collectives.plan._targets import Target

__all__ = [
    "DEFAULT_MODEL",
    "MAX_DEVICES",
    "MODELS",
    "PRECISIONS",
    "TARGETS",
    "Link",
    "Model",
    "Plan",
    "PlanRow",
    "Profile",
    "Target",
    "compile_units",
    "default_mesh",
    "load_profiles",
    "measured_profile",
    "model_from",
    "plan",
    "plan_each",
    "planned_recipes",
    "read_profiles",
]

"""Ensemble adaptation schemes: hyperparameters learnt from cross-chain statistics."""

from ._protocol import Adaptation
from ._base import AdaptationInfo, EnsembleAdaptation, as_array, finite_chain_mean

# --- LAPS ---
from .laps import LAPS, LAPSInfo

# --- ChEES and MEADS ---
from .chees import ChEES
from .meads import MEADS

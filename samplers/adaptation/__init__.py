"""Ensemble adaptation schemes: hyperparameters learnt from cross-chain statistics."""

from ._protocol import Adaptation
from ._base import AdaptationInfo, EnsembleAdaptation, as_array, finite_chain_mean
from ._bias_monitor import BiasMonitor, monitor_field
from ._ticks import listening, tick, ticking

# --- LAPS ---
from .laps import LAPS, LAPSInfo

# --- unadjusted MCLMC tuned by LAPS's phase 1 (the CLI's default for mclmc) ---
from .mclmc_tuning import MCLMCTuning, MCLMCTuningInfo

# --- ChEES and MEADS ---
from .chees import ChEES
from .meads import MEADS

# --- windowed warmup (any kernel with a step size) and non-finite chains ---
from ._restart import RestartInfo
from .window import WindowAdaptation, WindowAdaptationInfo, window_schedule

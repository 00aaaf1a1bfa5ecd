"""Ensemble adaptation schemes: hyperparameters learnt from cross-chain statistics."""

from ._base import AdaptationInfo, EnsembleAdaptation, as_array, finite_chain_mean

# --- LAPS ---
# --- ChEES and MEADS ---

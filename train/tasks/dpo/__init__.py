"""Preference tuning (DPO, IPO, SimPO) of a pretrained decoder-only model on pairs of replies."""

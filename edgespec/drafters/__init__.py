"""Drafters propose tokens for the target to verify. See base.Proposal for the contract."""

from .base import Drafter, KeepDrafting, Proposal
from .ngram import NgramDrafter, NgramMatch

__all__ = ["Drafter", "KeepDrafting", "Proposal", "NgramDrafter", "NgramMatch"]

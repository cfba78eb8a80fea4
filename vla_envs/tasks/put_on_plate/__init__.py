"""PutOnPlateInScene25: put one of 25 objects on a plate, on a ManiSkill table, seen through a
green-screened third-person camera. Task data in ``episodes.py`` and ``assets.py``; success and
reward in ``rewards.py``; the simulated scene in ``env.py`` (imported lazily: it needs
mani_skill)."""

"""Supervised warm-start stages: SFT on expert demos (``train``), vision pretraining on the expert's
scene poses (``vision``, with the throwaway ``heads``), correction demos (``corrections``) and
publishing the result as a warm start (``warm_start``)."""

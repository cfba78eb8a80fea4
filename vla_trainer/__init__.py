"""RL fine-tuning of Vision-Language-Action policies: models (``vla_trainer.models``)."""

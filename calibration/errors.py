"""Exceptions raised by the calibration tool. Each says what was wrong and what is allowed."""

from __future__ import annotations


class CalibrationError(ValueError):
    """Base class: the input cannot give a trustworthy calibration."""


class BoardNotDetectedError(CalibrationError):
    """The board (or enough of its corners) is not visible in an image; ``image`` names it."""

    def __init__(self, message: str, image: str):
        super().__init__(message)
        self.image = image


class TooFewSamplesError(CalibrationError):
    """Fewer usable images or robot poses than the solver needs."""


class InsufficientRotationError(CalibrationError):
    """The robot poses do not rotate enough, or only about one axis: hand-eye is unobservable."""


class SessionFormatError(CalibrationError):
    """A session folder or one of its files does not follow the documented format."""

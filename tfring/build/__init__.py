"""Build-time helpers of tfring (no TensorFlow import at import time)."""

"""Specs against running code: ``equiv`` proves a spec equal to a function, ``infer`` recovers one, the probe measures a converter."""

"""Choosing kernels: the Selector (lookup policy and the one fallback), the Tuner, the
Harness that measures, device timers, buckets for dynamic shapes, and record mode.
"""

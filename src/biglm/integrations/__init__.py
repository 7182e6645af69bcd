"""Adapters to third-party frameworks: lm-evaluation-harness, transformers pipelines, sentence-transformers, Ray.

Each module here imports biglm and its framework; nothing in biglm's core imports this room. Entry points (the
``biglm`` subcommands' ``cli`` modules) import what they drive, so the core installs and runs without any of
these frameworks loaded. The house map (docs/HOUSE.md) lists who may import what.
"""

"""tformer: train, evaluate and serve text classifiers built on a from-scratch Transformer encoder."""
__version__ = "0.1.0"

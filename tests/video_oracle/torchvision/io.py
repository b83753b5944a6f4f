"""Empty: transformers imports ``torchvision.io`` for decoding, which the oracle never does."""

"""A stand-in ``torchvision`` for the video-processor oracle (NOTE [ The torchvision stand-in ]).

Only what transformers' video processors call on a frame tensor: ``transforms.v2.functional``'s
resize, crop, pad, normalize and dtype changes, done with plain torch. Token counts depend on the
sizes the processors compute, never on the pixels these produce.
"""

__version__ = "0.28.0"

"""How the bundled demo model (``minisgl/demo/model``) is made, kept out of the shipped package:
the corpus, the training run and the model card. ``python -m tests.demo_training train``
retrains it, ``python -m tests.demo_training check`` compares its files with the card."""

"""cli stage: the ``tokenbucket`` command. ``main.py`` parses and dispatches; each verb is one
module (tokens, gpus, cost, ledger, profile, plan, inspect_, report, demo); ``_common.py`` holds
the flags they share."""

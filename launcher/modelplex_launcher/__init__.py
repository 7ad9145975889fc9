"""The ``modelplex`` command: the composition root that starts every component.

``modelplex local`` (``local.py``) runs whole deployments on this machine; ``modelplex replica``,
``router``, ``operator`` and ``cluster`` start one component each. Nothing else imports this
package: the core and the components stay below it.
"""

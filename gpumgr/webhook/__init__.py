"""The mutating admission webhook: GPU pods get the gpumgr scheduler, and pods that could never run are refused.

`review` reads and writes AdmissionReview v1 bodies, `policy` decides for one pod, `server` serves both over
HTTPS (aiohttp). `gpumgr webhook` (gpumgr/commands/webhook.py) runs it; docs/webhook.md describes it.
"""

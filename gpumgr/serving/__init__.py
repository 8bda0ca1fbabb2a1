"""HTTP serving shared by the scheduler extender and the admission webhook.

- body.py: reading a request body within bounds (size after decompression, time, a shared budget).
- site.py: the listening socket (TCP or TLS) with a cap on open connections and a handshake timeout.
- tls.py: TLS contexts (server and client) and the checks of their settings.
"""

"""The scheduler extender: filter, prioritize and bind for vcuda resources (`gpumgr extender`).

Modules, from the wire inwards:
    wire       the extender JSON (`k8s.io/kube-scheduler/extender/v1`): parsing and replies
    handlers   the aiohttp routes
    (request bodies are read within bounds by `gpumgr.serving.body`, shared with the webhook)
    lane       one request's CPU work at a time, smallest body first
    (the listening socket, with TLS, a cap on open connections and the handshake timeout, is
               `gpumgr.serving.site.CappedSite`, shared with the webhook)
    (the server's SSL context, client certificates required, and the scheduler's client context are
               `gpumgr.serving.tls`, shared with the webhook)
    server     `ExtenderServer`: the HTTP server, the cluster view and its watches, started in-process
    leader     leader election among replicas (a coordination.k8s.io Lease)
    binder     bind: choose cards, assume them, patch the pod, create the Binding
    podcalls   the bind's API calls (get, merge-patch, Binding) over aiohttp
    kubeaccess list + watch through the `kubernetes` client (in threads), and its configuration
    watcher    list + watch of nodes and pods, feeding the cluster view
    slim       the parts of a pod the view keeps
    cluster    the cluster view: nodes, what every pod holds, assumed holdings, cached fits
    plan       per-node summaries and per-class answers that let one filter skip most nodes
    nodestate  one node: inventory, topology, ledger of holdings
    claims     what a pod holds, read from its annotations
    ask        what a pod asks for, read from its containers and model annotations
    fit        placing all of a pod's GPU containers on one node (the allocator's `choose`)
    score      prioritize scores from fits
"""

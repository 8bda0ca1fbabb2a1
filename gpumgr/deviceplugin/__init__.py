"""The two kubelet device plugins (`tencent.com/vcuda-core`, `tencent.com/vcuda-memory`), API v1beta1."""

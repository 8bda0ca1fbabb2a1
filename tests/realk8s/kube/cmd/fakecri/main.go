// Command fakecri serves the in-tree fake CRI runtime (k8s.io/cri-client/pkg/fake, the one kubemark uses) on a
// unix socket for a real kubelet, and records every CreateContainer request as one JSON line in a file the
// tests read: what the kubelet handed the runtime (env, mounts, device nodes, CDI names, annotations, labels and
// the pod sandbox's metadata). It runs no container.
//
//	fakecri -socket /tmp/x/cri.sock -record /tmp/x/containers.jsonl
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	kubeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
)

func main() {
	socket := flag.String("socket", "", "unix socket to serve the CRI runtime and image services on")
	record := flag.String("record", "", "file to append one JSON line per CreateContainer request to")
	flag.Parse()
	if *socket == "" || *record == "" {
		fmt.Fprintln(os.Stderr, "fakecri: -socket and -record are required")
		os.Exit(2)
	}
	if err := serve(*socket, *record); err != nil {
		fmt.Fprintln(os.Stderr, "fakecri:", err)
		os.Exit(1)
	}
}

func serve(socket, recordPath string) error {
	out, err := os.OpenFile(recordPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	runtime := fake.NewFakeRemoteRuntime()
	// A zero image size fails every container ("Id or size of image ... is not set"); no filesystem usage fails
	// the eviction manager ("imagefs device is not found").
	runtime.ImageService.SetFakeImageSize(100 << 20)
	runtime.ImageService.SetFakeFilesystemUsage([]*kubeapi.FilesystemUsage{{
		Timestamp:  1,
		FsId:       &kubeapi.FilesystemIdentifier{Mountpoint: "/"},
		UsedBytes:  &kubeapi.UInt64Value{Value: 1 << 30},
		InodesUsed: &kubeapi.UInt64Value{Value: 1000},
	}})
	runtime.RuntimeService.FakeStatus = &kubeapi.RuntimeStatus{Conditions: []*kubeapi.RuntimeCondition{
		{Type: kubeapi.RuntimeReady, Status: true},
		{Type: kubeapi.NetworkReady, Status: true},
	}}
	_ = os.Remove(socket)
	listener, err := net.Listen("unix", socket)
	if err != nil {
		return err
	}
	server := grpc.NewServer()
	kubeapi.RegisterRuntimeServiceServer(server, &recording{RemoteRuntime: runtime, out: out})
	kubeapi.RegisterImageServiceServer(server, runtime)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		server.Stop()
	}()
	return server.Serve(listener)
}

// recording is the fake runtime with CreateContainer written down before it is answered.
type recording struct {
	*fake.RemoteRuntime
	mu  sync.Mutex
	out *os.File
}

func (r *recording) CreateContainer(ctx context.Context, req *kubeapi.CreateContainerRequest) (
	*kubeapi.CreateContainerResponse, error) {
	resp, err := r.RemoteRuntime.CreateContainer(ctx, req)
	line, merr := json.Marshal(recordOf(req, resp, err))
	if merr != nil {
		return nil, merr
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, werr := r.out.Write(append(line, '\n')); werr != nil {
		return nil, werr
	}
	return resp, err
}

func recordOf(req *kubeapi.CreateContainerRequest, resp *kubeapi.CreateContainerResponse, err error) Record {
	cfg := req.GetConfig()
	rec := Record{
		SandboxID:   req.GetPodSandboxId(),
		Name:        cfg.GetMetadata().GetName(),
		Attempt:     cfg.GetMetadata().GetAttempt(),
		Image:       cfg.GetImage().GetImage(),
		Envs:        map[string]string{},
		Labels:      cfg.GetLabels(),
		Annotations: cfg.GetAnnotations(),
	}
	if meta := req.GetSandboxConfig().GetMetadata(); meta != nil {
		rec.Pod = PodRef{Name: meta.GetName(), Namespace: meta.GetNamespace(), UID: meta.GetUid()}
	}
	for _, kv := range cfg.GetEnvs() {
		rec.Envs[kv.GetKey()] = string(kv.GetValue())
	}
	for _, m := range cfg.GetMounts() {
		rec.Mounts = append(rec.Mounts, Mount{ContainerPath: m.GetContainerPath(), HostPath: m.GetHostPath(),
			ReadOnly: m.GetReadonly()})
	}
	for _, d := range cfg.GetDevices() {
		rec.Devices = append(rec.Devices, Device{ContainerPath: d.GetContainerPath(), HostPath: d.GetHostPath(),
			Permissions: d.GetPermissions()})
	}
	for _, c := range cfg.GetCDIDevices() {
		rec.CDIDevices = append(rec.CDIDevices, c.GetName())
	}
	if err != nil {
		rec.Error = err.Error()
	} else {
		rec.ContainerID = resp.GetContainerId()
	}
	return rec
}

// Record is one CreateContainer request as the tests read it.
type Record struct {
	Pod         PodRef            `json:"pod"`
	SandboxID   string            `json:"sandboxId"`
	ContainerID string            `json:"containerId,omitempty"`
	Error       string            `json:"error,omitempty"`
	Name        string            `json:"name"`
	Attempt     uint32            `json:"attempt"`
	Image       string            `json:"image"`
	Envs        map[string]string `json:"envs"`
	Mounts      []Mount           `json:"mounts"`
	Devices     []Device          `json:"devices"`
	CDIDevices  []string          `json:"cdiDevices"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// PodRef is the pod sandbox's metadata.
type PodRef struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	UID       string `json:"uid"`
}

// Mount is one bind mount of the container.
type Mount struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	ReadOnly      bool   `json:"readOnly"`
}

// Device is one device node of the container.
type Device struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	Permissions   string `json:"permissions"`
}

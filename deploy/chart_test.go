package deploy_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/loader"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metavalidation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/scheme"
)

const chartDir = "helm/weir"

// chartCase is one set of values a user installs the chart with, and what
// the rendered release must then hold.
type chartCase struct {
	name      string
	release   string
	namespace string
	values    map[string]any
	// external Secrets the values name (they exist in the cluster, not in the chart).
	external []string
	// objects the release must consist of, as "Kind/name".
	want []string
}

var chartCases = []chartCase{
	{
		name: "defaults", release: "weir", namespace: "default",
		want: []string{"Secret/weir-token", "Service/weir-jobmanager", "StatefulSet/weir-jobmanager", "Deployment/weir-taskmanager"},
	},
	{
		name: "embedded broker for a trial", release: "trial", namespace: "streams",
		values: map[string]any{"broker": map[string]any{"enabled": true}},
		want: []string{
			"Secret/trial-weir-token", "Service/trial-weir-jobmanager", "StatefulSet/trial-weir-jobmanager",
			"Deployment/trial-weir-taskmanager", "Service/trial-weir-broker", "StatefulSet/trial-weir-broker",
		},
	},
	{
		name: "production: TLS, an existing token, five task managers", release: "prod", namespace: "weir-prod",
		values: map[string]any{
			"auth": map[string]any{"existingSecret": "weir-auth"},
			"tls":  map[string]any{"secretName": "weir-jm-tls"},
			"jobmanager": map[string]any{
				"restAllowedHosts": []any{"weir.example.com"},
				"storage":          map[string]any{"size": "50Gi", "storageClassName": "fast-ssd"},
				"resources":        map[string]any{"requests": map[string]any{"cpu": "1", "memory": "2Gi"}},
			},
			"taskmanager": map[string]any{
				"replicas": 5, "slots": 4,
				"dataPorts": map[string]any{"first": 7000, "last": 7003},
				"extraArgs": []any{"--log-format=json"},
				"resources": map[string]any{"limits": map[string]any{"cpu": "4", "memory": "8Gi"}},
			},
		},
		external: []string{"weir-auth", "weir-jm-tls"},
		want:     []string{"Service/prod-weir-jobmanager", "StatefulSet/prod-weir-jobmanager", "Deployment/prod-weir-taskmanager"},
	},
	haS3Case,
	{
		name: "high availability, checkpoints on a shared file volume", release: "weir", namespace: "default",
		values: map[string]any{
			"jobmanager":       map[string]any{"replicas": 2},
			"highAvailability": map[string]any{"enabled": true, "etcd": map[string]any{"endpoints": []any{"http://etcd.infra:2379"}}},
			"checkpointStorage": map[string]any{
				"url": "file:///var/lib/weir-checkpoints", "existingClaim": "weir-checkpoints",
			},
		},
		external: []string{"weir-checkpoints"},
		want: []string{
			"Secret/weir-token", "Service/weir-jobmanager", "Service/weir-jobmanager-headless",
			"StatefulSet/weir-jobmanager", "Deployment/weir-taskmanager",
		},
	},
}

// haS3Case is a production install: three job managers on an etcd with TLS
// and a user, checkpoints on S3 with credentials from a Secret, TLS.
var haS3Case = chartCase{
	name: "high availability on etcd, checkpoints on S3", release: "ha", namespace: "streams",
	values: map[string]any{
		"tls":        map[string]any{"secretName": "weir-jm-tls"},
		"jobmanager": map[string]any{"replicas": 3},
		"highAvailability": map[string]any{
			"enabled":   true,
			"clusterId": "prod-eu",
			"leaseTTL":  "10s",
			"etcd": map[string]any{
				"endpoints": []any{"https://etcd-0.etcd.infra:2379", "https://etcd-1.etcd.infra:2379", "https://etcd-2.etcd.infra:2379"},
				"tls":       map[string]any{"secretName": "etcd-client-tls", "clientCertificate": true},
				"auth":      map[string]any{"username": "weir", "passwordSecret": "etcd-weir-password"},
			},
		},
		"checkpointStorage": map[string]any{
			"url":               "s3://weir-state/prod?endpoint=https://s3.example:9000&region=eu-west-1",
			"credentialsSecret": "weir-s3",
		},
	},
	external: []string{"weir-jm-tls", "etcd-client-tls", "etcd-weir-password", "weir-s3"},
	want: []string{
		"Secret/ha-weir-token", "Service/ha-weir-jobmanager", "Service/ha-weir-jobmanager-headless",
		"StatefulSet/ha-weir-jobmanager", "Deployment/ha-weir-taskmanager",
	},
}

func TestChartLintsClean(t *testing.T) {
	for _, c := range chartCases {
		t.Run(c.name, func(t *testing.T) {
			res := lint.RunAll(chartDir, c.values, c.namespace)
			for _, m := range res.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("helm lint: %s", m)
				}
			}
		})
	}
}

func TestChartRendersStrictlyValidKubernetesObjects(t *testing.T) {
	bin := streamctl(t)
	for _, c := range chartCases {
		t.Run(c.name, func(t *testing.T) {
			objs, notes := render(t, c)
			var got []string
			for _, o := range objs {
				got = append(got, o.kind+"/"+o.meta.GetName())
			}
			sort.Strings(got)
			want := slices.Clone(c.want)
			sort.Strings(want)
			if !slices.Equal(got, want) {
				t.Fatalf("rendered objects %v, want %v", got, want)
			}
			checkRelease(t, c, objs)
			for _, o := range objs {
				for _, ctr := range containers(o) {
					checkArgs(t, bin, o, ctr)
				}
			}
			if !strings.Contains(notes, "port-forward svc/"+c.release) {
				t.Errorf("NOTES.txt does not say how to reach the job manager:\n%s", notes)
			}
		})
	}
}

func TestChartRefusesBadValues(t *testing.T) {
	for _, c := range []struct {
		name   string
		values map[string]any
		want   string
	}{
		{"a misspelt key", map[string]any{"taskmanager": map[string]any{"slot": 4}}, "slot"},
		{"zero slots", map[string]any{"taskmanager": map[string]any{"slots": 0}}, "slots"},
		{"a size without a unit", map[string]any{"jobmanager": map[string]any{"storage": map[string]any{"size": "10"}}}, "size"},
		{"data ports reversed", map[string]any{"taskmanager": map[string]any{"dataPorts": map[string]any{"first": 7010, "last": 7000}}}, "dataPorts.first must not be above"},
		{"several job managers without high availability", map[string]any{"jobmanager": map[string]any{"replicas": 3}}, "jobmanager.replicas above 1 needs highAvailability.enabled"},
		{"high availability without etcd endpoints", map[string]any{
			"highAvailability":  map[string]any{"enabled": true},
			"checkpointStorage": map[string]any{"url": "s3://b/p"},
		}, "needs highAvailability.etcd.endpoints"},
		{"high availability without checkpoint storage", map[string]any{
			"highAvailability": map[string]any{"enabled": true, "etcd": map[string]any{"endpoints": []any{"http://etcd:2379"}}},
		}, "needs checkpointStorage.url"},
		{"file storage without a shared volume", map[string]any{"checkpointStorage": map[string]any{"url": "file:///ckpt"}}, "needs checkpointStorage.existingClaim"},
		{"in-memory checkpoint storage", map[string]any{"checkpointStorage": map[string]any{"url": "mem://x"}}, "url"},
		{"an etcd user without its password", map[string]any{
			"highAvailability":  map[string]any{"enabled": true, "etcd": map[string]any{"endpoints": []any{"http://etcd:2379"}, "auth": map[string]any{"username": "weir"}}},
			"checkpointStorage": map[string]any{"url": "s3://b/p"},
		}, "needs highAvailability.etcd.auth.passwordSecret"},
		{"an etcd password inline", map[string]any{"highAvailability": map[string]any{"etcd": map[string]any{"auth": map[string]any{"password": "hunter2"}}}}, "password"},
		{"a lease shorter than the job manager accepts", map[string]any{"highAvailability": map[string]any{"leaseTTL": "1s"}}, "leaseTTL"},
		{"endpoints without a scheme", map[string]any{"highAvailability": map[string]any{"etcd": map[string]any{"endpoints": []any{"etcd:2379"}}}}, "endpoints"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := renderFiles(chartCase{release: "weir", namespace: "default", values: c.values})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("render with %v: error %v, want one naming %q", c.values, err, c.want)
			}
		})
	}
}

// object is one rendered Kubernetes object, decoded strictly into its Go type.
type object struct {
	file string
	kind string
	meta metav1.Object
	obj  runtime.Object
}

func renderFiles(c chartCase) (map[string]string, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return nil, err
	}
	vals, err := util.ToRenderValues(ch, c.values, common.ReleaseOptions{Name: c.release, Namespace: c.namespace, IsInstall: true, Revision: 1}, nil)
	if err != nil {
		return nil, err
	}
	return engine.Render(ch, vals)
}

// render renders the chart with c's values and decodes every manifest with
// client-go's scheme in strict mode: an unknown field, a duplicate field or a
// value of the wrong type is an error, as the API server's strict field
// validation would report it.
func render(t *testing.T, c chartCase) ([]object, string) {
	t.Helper()
	files, err := renderFiles(c)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	decoder := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	var objs []object
	var notes string
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range files {
			if !yield(k) {
				return
			}
		}
	})
	for _, name := range names {
		text := files[name]
		if strings.HasSuffix(name, "NOTES.txt") {
			notes = text
			continue
		}
		for _, doc := range strings.Split(text, "\n---") {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			obj, gvk, err := decoder.Decode([]byte(doc), nil, nil)
			if err != nil {
				t.Fatalf("%s: not a valid Kubernetes object: %v\n%s", name, err, doc)
			}
			m, err := metaOf(obj)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			objs = append(objs, object{file: name, kind: gvk.Kind, meta: m, obj: obj})
		}
	}
	return objs, notes
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func metaOf(obj runtime.Object) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no object metadata", obj)
	}
	return m, nil
}

// podTemplate returns the pod template of a workload, nil for other kinds.
func podTemplate(o object) *corev1.PodTemplateSpec {
	switch w := o.obj.(type) {
	case *appsv1.Deployment:
		return &w.Spec.Template
	case *appsv1.StatefulSet:
		return &w.Spec.Template
	}
	return nil
}

func containers(o object) []corev1.Container {
	if pt := podTemplate(o); pt != nil {
		return pt.Spec.Containers
	}
	return nil
}

// checkRelease checks what the API server's validation and the pods at run
// time would trip over: names and labels, selectors that select their pods,
// Services that reach a named container port, volumes and Secrets that
// exist, environment variables that are defined, and the task managers
// pointing at the job manager's Service.
func checkRelease(t *testing.T, c chartCase, objs []object) {
	t.Helper()
	secrets := map[string]bool{}
	for _, s := range c.external {
		secrets[s] = true
	}
	for _, o := range objs {
		if s, ok := o.obj.(*corev1.Secret); ok {
			secrets[o.meta.GetName()] = true
			if tok := s.Data["token"]; len(tok) < 32 {
				t.Errorf("Secret %s: token of %d bytes, want at least 32", s.Name, len(tok))
			}
		}
	}
	for _, o := range objs {
		where := o.kind + "/" + o.meta.GetName()
		for _, msg := range validation.IsDNS1123Subdomain(o.meta.GetName()) {
			t.Errorf("%s: name: %s", where, msg)
		}
		if errs := metavalidation.ValidateLabels(o.meta.GetLabels(), field.NewPath("metadata", "labels")); len(errs) > 0 {
			t.Errorf("%s: %v", where, errs.ToAggregate())
		}
		switch w := o.obj.(type) {
		case *corev1.Service:
			for _, msg := range validation.IsDNS1035Label(w.Name) {
				t.Errorf("%s: Service name: %s", where, msg)
			}
			checkServiceReachesPods(t, where, w, objs)
		case *appsv1.Deployment:
			checkWorkload(t, where, w.Spec.Selector, &w.Spec.Template, nil, secrets)
		case *appsv1.StatefulSet:
			checkWorkload(t, where, w.Spec.Selector, &w.Spec.Template, w.Spec.VolumeClaimTemplates, secrets)
			if !hasService(objs, w.Spec.ServiceName) {
				t.Errorf("%s: serviceName %q is not a Service of the release", where, w.Spec.ServiceName)
			}
		}
	}
	checkTaskManagersFindJobManager(t, c, objs)
}

func hasService(objs []object, name string) bool {
	for _, o := range objs {
		if o.kind == "Service" && o.meta.GetName() == name {
			return true
		}
	}
	return false
}

func checkWorkload(t *testing.T, where string, sel *metav1.LabelSelector, pt *corev1.PodTemplateSpec, claims []corev1.PersistentVolumeClaim, secrets map[string]bool) {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil || s.Empty() {
		t.Errorf("%s: selector %v: %v", where, sel, err)
	} else if !s.Matches(labels.Set(pt.Labels)) {
		t.Errorf("%s: selector %v does not select its own pods (labels %v)", where, sel, pt.Labels)
	}
	if errs := metavalidation.ValidateLabels(pt.Labels, field.NewPath("spec", "template", "metadata", "labels")); len(errs) > 0 {
		t.Errorf("%s: %v", where, errs.ToAggregate())
	}
	sc := pt.Spec.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("%s: pods may run as root", where)
	}
	volumes := map[string]bool{}
	for _, v := range pt.Spec.Volumes {
		volumes[v.Name] = true
		if v.Secret != nil && !secrets[v.Secret.SecretName] {
			t.Errorf("%s: volume %s mounts Secret %q, which neither the chart nor the values provide", where, v.Name, v.Secret.SecretName)
		}
		if v.PersistentVolumeClaim != nil && !secrets[v.PersistentVolumeClaim.ClaimName] {
			t.Errorf("%s: volume %s mounts claim %q, which the values do not name", where, v.Name, v.PersistentVolumeClaim.ClaimName)
		}
	}
	for _, c := range claims {
		volumes[c.Name] = true
	}
	for _, ctr := range pt.Spec.Containers {
		cw := where + " container " + ctr.Name
		if ctr.Image == "" || strings.HasSuffix(ctr.Image, ":") {
			t.Errorf("%s: image %q has no tag", cw, ctr.Image)
		}
		ports := map[string]bool{}
		for _, p := range ctr.Ports {
			for _, msg := range validation.IsValidPortName(p.Name) {
				t.Errorf("%s: port name %q: %s", cw, p.Name, msg)
			}
			for _, msg := range validation.IsValidPortNum(int(p.ContainerPort)) {
				t.Errorf("%s: port %d: %s", cw, p.ContainerPort, msg)
			}
			if ports[p.Name] {
				t.Errorf("%s: port name %q twice", cw, p.Name)
			}
			ports[p.Name] = true
		}
		for _, m := range ctr.VolumeMounts {
			if !volumes[m.Name] {
				t.Errorf("%s: mounts volume %q, which the pod does not have", cw, m.Name)
			}
		}
		for _, pr := range []*corev1.Probe{ctr.ReadinessProbe, ctr.LivenessProbe} {
			if pr != nil && pr.TCPSocket != nil && !ports[pr.TCPSocket.Port.String()] {
				t.Errorf("%s: probe on port %q, which the container does not name", cw, pr.TCPSocket.Port.String())
			}
			if pr != nil && pr.HTTPGet != nil && !ports[pr.HTTPGet.Port.String()] {
				t.Errorf("%s: probe on port %q, which the container does not name", cw, pr.HTTPGet.Port.String())
			}
		}
		env := map[string]bool{}
		for _, e := range ctr.Env {
			env[e.Name] = true
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && !secrets[e.ValueFrom.SecretKeyRef.Name] {
				t.Errorf("%s: variable %s reads Secret %q, which neither the chart nor the values provide", cw, e.Name, e.ValueFrom.SecretKeyRef.Name)
			}
		}
		for _, a := range ctr.Args {
			for _, ref := range envRefs(a) {
				if !env[ref] {
					t.Errorf("%s: argument %q uses $(%s), which the container does not define", cw, a, ref)
				}
			}
		}
		cs := ctr.SecurityContext
		if cs == nil || cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem || cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation {
			t.Errorf("%s: container security context is not locked down: %+v", cw, cs)
		}
	}
}

// envRefs returns the variable names a container argument refers to with
// Kubernetes' $(NAME) syntax.
func envRefs(arg string) []string {
	var refs []string
	for {
		i := strings.Index(arg, "$(")
		if i < 0 {
			return refs
		}
		j := strings.IndexByte(arg[i:], ')')
		if j < 0 {
			return refs
		}
		refs = append(refs, arg[i+2:i+j])
		arg = arg[i+j+1:]
	}
}

func checkServiceReachesPods(t *testing.T, where string, svc *corev1.Service, objs []object) {
	t.Helper()
	sel := labels.SelectorFromSet(svc.Spec.Selector)
	var selected []*corev1.PodTemplateSpec
	for _, o := range objs {
		if pt := podTemplate(o); pt != nil && len(svc.Spec.Selector) > 0 && sel.Matches(labels.Set(pt.Labels)) {
			selected = append(selected, pt)
		}
	}
	if len(selected) != 1 {
		t.Errorf("%s: selects %d workloads' pods, want 1", where, len(selected))
		return
	}
	named := map[string]int32{}
	for _, c := range selected[0].Spec.Containers {
		for _, p := range c.Ports {
			named[p.Name] = p.ContainerPort
		}
	}
	for _, p := range svc.Spec.Ports {
		if _, ok := named[p.TargetPort.String()]; !ok {
			t.Errorf("%s: port %s targets %q, which its pods do not name", where, p.Name, p.TargetPort.String())
		}
	}
}

// checkTaskManagersFindJobManager checks that the task managers dial the
// job managers: a Service of the release on its rpc port, or (highly
// available) every pod of the job-manager StatefulSet by its stable name
// under a headless Service that publishes pods before they are ready; and
// that the job manager accepts its client Service's names in REST Host
// headers.
func checkTaskManagersFindJobManager(t *testing.T, c chartCase, objs []object) {
	t.Helper()
	tmArgs := flagValues(t, find[*appsv1.Deployment](t, objs, "taskmanager").Spec.Template.Spec.Containers[0].Args)
	jm := find[*appsv1.StatefulSet](t, objs, "jobmanager")
	jmArgs := flagValues(t, jm.Spec.Template.Spec.Containers[0].Args)
	services := map[string]*corev1.Service{}
	for _, o := range objs {
		if svc, ok := o.obj.(*corev1.Service); ok {
			services[svc.Name] = svc
		}
	}
	rpcPort := func(svc *corev1.Service) string {
		for _, p := range svc.Spec.Ports {
			if p.Name == "rpc" {
				return fmt.Sprint(p.Port)
			}
		}
		return ""
	}
	addrs := strings.Split(tmArgs["--jobmanager"], ",")
	if len(addrs) == 1 {
		host, port, _ := strings.Cut(addrs[0], ":")
		if svc := services[host]; svc == nil || rpcPort(svc) != port || svc.Spec.ClusterIP == corev1.ClusterIPNone {
			t.Errorf("task managers dial %s, which is no Service's rpc port in the release", addrs[0])
		}
	} else {
		svc := services[jm.Spec.ServiceName]
		if svc == nil || svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses {
			t.Fatalf("the job managers' serviceName %q is not a headless Service publishing pods not ready (standbys never are)", jm.Spec.ServiceName)
		}
		var want []string
		for i := range int(*jm.Spec.Replicas) {
			want = append(want, fmt.Sprintf("%s-%d.%s.%s.svc:%s", jm.Name, i, svc.Name, c.namespace, rpcPort(svc)))
		}
		if !slices.Equal(addrs, want) {
			t.Errorf("task managers dial %v, want every job manager: %v", addrs, want)
		}
	}
	client := jm.Name // the client-facing Service is named as the StatefulSet
	if services[client] == nil || services[client].Spec.ClusterIP == corev1.ClusterIPNone {
		t.Errorf("no client-facing Service %s", client)
	}
	if !slices.Contains(strings.Split(jmArgs["--rest-allowed-hosts"], ","), client) {
		t.Errorf("the job manager's --rest-allowed-hosts=%s does not accept its Service name %s", jmArgs["--rest-allowed-hosts"], client)
	}
}

// find returns the one workload of type T whose component label is component.
func find[T interface {
	*appsv1.Deployment | *appsv1.StatefulSet
	metav1.Object
}](t *testing.T, objs []object, component string) T {
	t.Helper()
	for _, o := range objs {
		if w, ok := o.obj.(T); ok && w.GetLabels()["app.kubernetes.io/component"] == component {
			return w
		}
	}
	t.Fatalf("no %s workload in the release", component)
	return nil
}

// flagValues returns a container's --name=value arguments by name (the
// chart writes every flag that way); checkArgs proves the binary parses them.
func flagValues(t *testing.T, args []string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, a := range args {
		if name, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(name, "--") {
			if _, dup := m[name]; dup {
				t.Errorf("flag %s given twice", name)
			}
			m[name] = v
		}
	}
	return m
}

// checkArgs runs the image's binary with the container's arguments and
// --help: cobra parses every flag before it prints help, so an unknown flag,
// a misspelt one or a value of the wrong type fails here, as it would in the pod.
func checkArgs(t *testing.T, bin string, o object, ctr corev1.Container) {
	t.Helper()
	args := append(slices.Clone(ctr.Args), "--help")
	out, err := exec.CommandContext(t.Context(), bin, args...).CombinedOutput()
	if err != nil {
		t.Errorf("%s/%s container %s: streamctl %s: %v\n%s", o.kind, o.meta.GetName(), ctr.Name, strings.Join(ctr.Args, " "), err, out)
	}
}

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// streamctl builds the streamctl binary the image holds (static, as
// deploy/Dockerfile builds it) once per test binary.
func streamctl(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "weir-deploy-test-")
		if err != nil {
			buildErr = err
			return
		}
		builtBin = filepath.Join(dir, "streamctl")
		cmd := exec.CommandContext(context.Background(), "go", "build", "-o", builtBin, "./cmd/streamctl")
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/streamctl: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if builtBin != "" {
		os.RemoveAll(filepath.Dir(builtBin))
	}
	os.Exit(code)
}

// With high availability the job managers are a StatefulSet of N pods that
// start together, each announcing its own stable name, all of one cluster
// in etcd with the values' endpoints, TLS and user; only the leader passes
// the readiness probe, so the client Service reaches the leader alone; and
// job managers and task managers alike read the S3 credentials from the
// Secret the values name, never from an inline value.
func TestChartRunsJobManagersHighlyAvailable(t *testing.T) {
	c := haS3Case
	objs, _ := render(t, c)
	jm := find[*appsv1.StatefulSet](t, objs, "jobmanager")
	tm := find[*appsv1.Deployment](t, objs, "taskmanager")
	if *jm.Spec.Replicas != 3 || jm.Spec.PodManagementPolicy != appsv1.ParallelPodManagement || jm.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType {
		t.Errorf("job managers: %d replicas, %s, %s; want 3 started in parallel, replaced on delete (a standby never becomes ready)",
			*jm.Spec.Replicas, jm.Spec.PodManagementPolicy, jm.Spec.UpdateStrategy.Type)
	}
	if len(jm.Spec.VolumeClaimTemplates) != 0 {
		t.Errorf("highly available job managers claim volumes %v; their state is in etcd and the checkpoint storage", jm.Spec.VolumeClaimTemplates)
	}
	jmc := jm.Spec.Template.Spec.Containers[0]
	got := flagValues(t, jmc.Args)
	for flag, want := range map[string]string{
		"--ha":                 "etcd",
		"--etcd-endpoints":     "https://etcd-0.etcd.infra:2379,https://etcd-1.etcd.infra:2379,https://etcd-2.etcd.infra:2379",
		"--ha-cluster-id":      "prod-eu",
		"--ha-lease-ttl":       "10s",
		"--checkpoint-storage": "s3://weir-state/prod?endpoint=https://s3.example:9000&region=eu-west-1",
		"--advertise-address":  "$(POD_NAME).ha-weir-jobmanager-headless.streams.svc:6123",
		"--etcd-cacert":        "/etc/weir/etcd-tls/ca.crt",
		"--etcd-cert":          "/etc/weir/etcd-tls/tls.crt",
		"--etcd-key":           "/etc/weir/etcd-tls/tls.key",
		"--etcd-username":      "weir",
		"--etcd-password-file": "/etc/weir/etcd-auth/password",
	} {
		if got[flag] != want {
			t.Errorf("job manager %s=%q, want %q", flag, got[flag], want)
		}
	}
	// Each pod's advertised address, $(POD_NAME) expanded, is one the task
	// managers dial.
	podName := false
	for _, e := range jmc.Env {
		podName = podName || (e.Name == "POD_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name")
	}
	if !podName {
		t.Error("job manager: POD_NAME is not the pod's name")
	}
	dialed := strings.Split(flagValues(t, tm.Spec.Template.Spec.Containers[0].Args)["--jobmanager"], ",")
	for i := range 3 {
		adv := strings.ReplaceAll(got["--advertise-address"], "$(POD_NAME)", fmt.Sprintf("%s-%d", jm.Name, i))
		if !slices.Contains(dialed, adv) {
			t.Errorf("job manager %d announces %s, which the task managers (--jobmanager=%s) do not dial", i, adv, strings.Join(dialed, ","))
		}
	}
	rp := jmc.ReadinessProbe
	if rp == nil || rp.HTTPGet == nil || rp.HTTPGet.Path != "/readyz" || rp.HTTPGet.Port.String() != "http" || rp.HTTPGet.Scheme != corev1.URISchemeHTTPS {
		t.Errorf("job manager readiness probe %+v; want GET /readyz on http over HTTPS (only the leader answers 200)", rp)
	}
	mounted := map[string]string{}
	for _, v := range jm.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			mounted[v.Secret.SecretName] = v.Name
		}
	}
	for _, s := range []string{"etcd-client-tls", "etcd-weir-password"} {
		if mounted[s] == "" {
			t.Errorf("job manager does not mount Secret %s", s)
		}
	}
	for _, ctr := range []corev1.Container{jmc, tm.Spec.Template.Spec.Containers[0]} {
		fromSecret := map[string]bool{}
		for _, e := range ctr.Env {
			if strings.HasPrefix(e.Name, "AWS_") {
				if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != "weir-s3" {
					t.Errorf("%s: %s is not read from Secret weir-s3: %+v", ctr.Name, e.Name, e)
					continue
				}
				fromSecret[e.Name] = true
			}
		}
		for _, v := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"} {
			if !fromSecret[v] {
				t.Errorf("%s: no %s from Secret weir-s3", ctr.Name, v)
			}
		}
	}
}

// Checkpoints on a file:// URL need one volume every pod shares: the claim
// is mounted at the URL's path on job managers and task managers.
func TestChartMountsFileCheckpointStorageEverywhere(t *testing.T) {
	i := slices.IndexFunc(chartCases, func(c chartCase) bool { return strings.Contains(c.name, "shared file volume") })
	objs, _ := render(t, chartCases[i])
	for _, w := range []*corev1.PodTemplateSpec{
		&find[*appsv1.StatefulSet](t, objs, "jobmanager").Spec.Template,
		&find[*appsv1.Deployment](t, objs, "taskmanager").Spec.Template,
	} {
		claim := ""
		for _, v := range w.Spec.Volumes {
			if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == "weir-checkpoints" {
				claim = v.Name
			}
		}
		ctr := w.Spec.Containers[0]
		at := ""
		for _, m := range ctr.VolumeMounts {
			if m.Name == claim {
				at = m.MountPath
			}
		}
		if claim == "" || at != "/var/lib/weir-checkpoints" {
			t.Errorf("%s: claim weir-checkpoints mounted at %q, want /var/lib/weir-checkpoints", ctr.Name, at)
		}
	}
}

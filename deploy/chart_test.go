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
	checkTaskManagersFindJobManager(t, objs)
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
		}
		env := map[string]bool{}
		for _, e := range ctr.Env {
			env[e.Name] = true
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

// checkTaskManagersFindJobManager checks that the task managers dial a
// Service of the release on a port it exposes, and that the job manager
// accepts that Service's names in REST Host headers.
func checkTaskManagersFindJobManager(t *testing.T, objs []object) {
	t.Helper()
	var jmAddr, allowed string
	for _, o := range objs {
		for _, ctr := range containers(o) {
			for _, a := range ctr.Args {
				if v, ok := strings.CutPrefix(a, "--jobmanager="); ok {
					jmAddr = v
				}
				if v, ok := strings.CutPrefix(a, "--rest-allowed-hosts="); ok {
					allowed = v
				}
			}
		}
	}
	host, port, ok := strings.Cut(jmAddr, ":")
	if !ok {
		t.Fatalf("task managers have no --jobmanager=HOST:PORT (got %q)", jmAddr)
	}
	found := false
	for _, o := range objs {
		if svc, ok := o.obj.(*corev1.Service); ok && svc.Name == host {
			for _, p := range svc.Spec.Ports {
				if fmt.Sprint(p.Port) == port && p.Name == "rpc" {
					found = true
				}
			}
		}
	}
	if !found {
		t.Errorf("task managers dial %s, which is no Service's rpc port in the release", jmAddr)
	}
	if !slices.Contains(strings.Split(allowed, ","), host) {
		t.Errorf("the job manager's --rest-allowed-hosts=%s does not accept its Service name %s", allowed, host)
	}
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

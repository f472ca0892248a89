// k8s-check validates Kubernetes manifests offline the way the API server would decode
// them: every document is decoded strictly (unknown or misspelt fields are errors) into
// the typed objects of k8s.io/api, and container environments are checked for $(VAR)
// references to variables defined later or not at all (Kubernetes leaves those as literal
// text). Usage: k8s-check FILE...
package main

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

type typeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

func podSpec(obj interface{}) *corev1.PodSpec {
	switch o := obj.(type) {
	case *appsv1.DaemonSet:
		return &o.Spec.Template.Spec
	case *appsv1.Deployment:
		return &o.Spec.Template.Spec
	case *appsv1.StatefulSet:
		return &o.Spec.Template.Spec
	case *corev1.Pod:
		return &o.Spec
	}
	return nil
}

func checkEnv(spec *corev1.PodSpec) []string {
	var errs []string
	containers := append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...)
	for _, c := range containers {
		defined := map[string]bool{}
		for _, e := range c.Env {
			for _, m := range varRef.FindAllStringSubmatch(e.Value, -1) {
				if !defined[m[1]] {
					errs = append(errs, fmt.Sprintf("container %s: env %s uses $(%s) before it is defined (it stays literal text)", c.Name, e.Name, m[1]))
				}
			}
			defined[e.Name] = true
		}
	}
	return errs
}

func check(path string) []string {
	data, err := os.ReadFile(path)
	if err != nil {
		return []string{err.Error()}
	}
	var errs []string
	for i, doc := range bytes.Split(data, []byte("\n---")) {
		if len(bytes.TrimSpace(doc)) == 0 || strings.TrimSpace(stripComments(string(doc))) == "" {
			continue
		}
		var tm typeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			errs = append(errs, fmt.Sprintf("%s doc %d: %v", path, i, err))
			continue
		}
		var obj interface{}
		switch tm.APIVersion + "/" + tm.Kind {
		case "apps/v1/DaemonSet":
			obj = &appsv1.DaemonSet{}
		case "apps/v1/Deployment":
			obj = &appsv1.Deployment{}
		case "apps/v1/StatefulSet":
			obj = &appsv1.StatefulSet{}
		case "v1/Pod":
			obj = &corev1.Pod{}
		case "v1/Service":
			obj = &corev1.Service{}
		case "v1/ServiceAccount":
			obj = &corev1.ServiceAccount{}
		case "v1/ConfigMap":
			obj = &corev1.ConfigMap{}
		case "rbac.authorization.k8s.io/v1/ClusterRole":
			obj = &rbacv1.ClusterRole{}
		case "rbac.authorization.k8s.io/v1/ClusterRoleBinding":
			obj = &rbacv1.ClusterRoleBinding{}
		default:
			errs = append(errs, fmt.Sprintf("%s doc %d: kind %s/%s not known to this checker", path, i, tm.APIVersion, tm.Kind))
			continue
		}
		// As the API server decodes: field names case-sensitive, unknown fields and
		// duplicate keys are errors.
		js, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s doc %d (%s): %v", path, i, tm.Kind, err))
			continue
		}
		strict, err := kjson.UnmarshalStrict(js, obj, kjson.DisallowUnknownFields)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s doc %d (%s): %v", path, i, tm.Kind, err))
			continue
		}
		for _, e := range strict {
			errs = append(errs, fmt.Sprintf("%s doc %d (%s): %v", path, i, tm.Kind, e))
		}
		if len(strict) > 0 {
			continue
		}
		if spec := podSpec(obj); spec != nil {
			for _, e := range checkEnv(spec) {
				errs = append(errs, fmt.Sprintf("%s doc %d (%s): %s", path, i, tm.Kind, e))
			}
		}
		fmt.Printf("ok %s doc %d: %s %s\n", path, i, tm.APIVersion, tm.Kind)
	}
	return errs
}

func stripComments(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: k8s-check FILE...")
		os.Exit(2)
	}
	var all []string
	for _, p := range os.Args[1:] {
		all = append(all, check(p)...)
	}
	for _, e := range all {
		fmt.Fprintln(os.Stderr, "error:", e)
	}
	if len(all) > 0 {
		os.Exit(1)
	}
}

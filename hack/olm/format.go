package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/operator-framework/api/pkg/validation/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"
)

// The annotations a registry+v1 bundle must carry, with the value each must have ("" means any
// non-empty value).
var requiredAnnotations = map[string]string{
	"operators.operatorframework.io.bundle.mediatype.v1": "registry+v1",
	"operators.operatorframework.io.bundle.manifests.v1": "manifests/",
	"operators.operatorframework.io.bundle.metadata.v1":  "metadata/",
	"operators.operatorframework.io.bundle.package.v1":   "",
	"operators.operatorframework.io.bundle.channels.v1":  "",
}

// Kinds operator-registry accepts in manifests/ besides ClusterServiceVersion and
// CustomResourceDefinition.
var allowedKinds = map[string]bool{
	"Secret": true, "ConfigMap": true, "Service": true, "ServiceAccount": true,
	"Role": true, "RoleBinding": true, "ClusterRole": true, "ClusterRoleBinding": true,
	"PrometheusRule": true, "ServiceMonitor": true, "PodMonitor": true,
	"PodDisruptionBudget": true, "PriorityClass": true, "VerticalPodAutoscaler": true,
	"NetworkPolicy": true, "ConsoleYAMLSample": true, "ConsoleQuickStart": true,
	"ConsoleCLIDownload": true, "ConsoleLink": true, "ConsolePlugin": true,
	"ClusterServiceVersion": true, "CustomResourceDefinition": true,
}

// checkFormat restates operator-registry's bundle format checks: the directory layout, the
// annotations in metadata/annotations.yaml, and the kinds in manifests/.
func checkFormat(dir string) []finding {
	var out []finding
	fail := func(source, format string, args ...any) {
		out = append(out, finding{level: errors.LevelError, source: source, text: "Error: " + fmt.Sprintf(format, args...)})
	}
	annotationsPath := filepath.Join(dir, "metadata", "annotations.yaml")
	raw, err := os.ReadFile(annotationsPath)
	if err != nil {
		fail("format", "%v", err)
		return out
	}
	var file struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := sigsyaml.UnmarshalStrict(raw, &file); err != nil {
		fail("format", "%s: %v", annotationsPath, err)
		return out
	}
	keys := make([]string, 0, len(requiredAnnotations))
	for k := range requiredAnnotations {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		want := requiredAnnotations[key]
		got, ok := file.Annotations[key]
		switch {
		case !ok || got == "":
			fail("format", "%s: annotation %s is missing", annotationsPath, key)
		case want != "" && got != want:
			fail("format", "%s: annotation %s is %q, want %q", annotationsPath, key, got, want)
		}
	}
	channels := strings.Split(file.Annotations["operators.operatorframework.io.bundle.channels.v1"], ",")
	if def, ok := file.Annotations["operators.operatorframework.io.bundle.channel.default.v1"]; ok {
		found := false
		for _, c := range channels {
			found = found || c == def
		}
		if !found {
			fail("format", "%s: default channel %q is not one of the channels %v", annotationsPath, def, channels)
		}
	}
	for _, pkg := range []string{file.Annotations["operators.operatorframework.io.bundle.package.v1"]} {
		for _, msg := range validation.IsDNS1123Label(pkg) {
			fail("format", "%s: package name %q: %s", annotationsPath, pkg, msg)
		}
	}

	manifestsDir := filepath.Join(dir, "manifests")
	entries, err := os.ReadDir(manifestsDir)
	if err != nil {
		fail("format", "%v", err)
		return out
	}
	csvs := 0
	for _, entry := range entries {
		if entry.IsDir() {
			fail("format", "%s: manifests/ must not contain directories", entry.Name())
			continue
		}
		path := filepath.Join(manifestsDir, entry.Name())
		raw, err := os.ReadFile(path)
		if err != nil {
			fail("format", "%v", err)
			continue
		}
		decoder := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
		for {
			var obj unstructured.Unstructured
			if err := decoder.Decode(&obj.Object); err != nil {
				if err != io.EOF {
					fail("format", "%s: %v", path, err)
				}
				break
			}
			if len(obj.Object) == 0 {
				continue
			}
			kind := obj.GetKind()
			if !allowedKinds[kind] {
				fail("format", "%s: kind %s is not allowed in a bundle", path, kind)
			}
			if kind == "ClusterServiceVersion" {
				csvs++
			}
			for _, msg := range validation.IsDNS1123Subdomain(obj.GetName()) {
				fail("format", "%s: %s name %q: %s", path, kind, obj.GetName(), msg)
			}
		}
	}
	if csvs != 1 {
		fail("format", "%s: %d ClusterServiceVersions, want exactly one", manifestsDir, csvs)
	}
	return out
}

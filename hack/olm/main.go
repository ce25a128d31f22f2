// Command olm-validate runs operator-framework's own bundle validators on a registry+v1 bundle
// directory: the default bundle validators (CSV, CRD, bundle) and the "operatorframework"
// optional suite that `operator-sdk bundle validate --select-optional suite=operatorframework`
// runs (OperatorHub v2, capabilities, categories, removed/deprecated APIs, good practices).
//
// operator-registry's format checks (annotations.yaml keys, which kinds may sit in manifests/)
// live in a module far heavier than this tool deserves, so they are restated in format.go.
//
// Every error and every warning is printed; the exit status is 1 if there is any of either,
// 2 if the bundle cannot be read at all.
//
//	go run . [-k8s-version 1.30] ../../bundle
package main

import (
	"flag"
	"fmt"
	"os"
	"sort"

	"github.com/operator-framework/api/pkg/manifests"
	"github.com/operator-framework/api/pkg/validation"
	"github.com/operator-framework/api/pkg/validation/errors"
)

func main() {
	k8sVersion := flag.String("k8s-version", "",
		"Kubernetes version the removed-API check assumes (default: the CSV's minKubeVersion)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s [flags] BUNDLE_DIR\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	dir := flag.Arg(0)

	findings := checkFormat(dir)

	bundle, err := manifests.GetBundleFromDir(dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "olm-validate: loading %s: %v\n", dir, err)
		os.Exit(2)
	}
	validators := validation.DefaultBundleValidators.WithValidators(
		validation.OperatorHubV2Validator,
		validation.StandardCapabilitiesValidator,
		validation.StandardCategoriesValidator,
		validation.AlphaDeprecatedAPIsValidator,
		validation.GoodPracticesValidator,
	)
	objects := bundle.ObjectsToValidate()
	if *k8sVersion != "" {
		objects = append(objects, map[string]string{"k8s-version": *k8sVersion})
	}
	for _, result := range validators.Validate(objects...) {
		for _, e := range result.Errors {
			findings = append(findings, finding{level: errors.LevelError, source: result.Name, text: e.Error()})
		}
		for _, w := range result.Warnings {
			findings = append(findings, finding{level: errors.LevelWarn, source: result.Name, text: w.Error()})
		}
	}

	sort.SliceStable(findings, func(i, j int) bool { return findings[i].level < findings[j].level })
	for _, f := range findings {
		fmt.Printf("%s: %s\n", f.source, f.text)
	}
	csvName := bundle.CSV.GetName()
	if len(findings) > 0 {
		fmt.Printf("olm-validate: %s: %d finding(s); errors and warnings both fail\n", csvName, len(findings))
		os.Exit(1)
	}
	fmt.Printf("olm-validate: %s (package %s, channels %v): 0 errors, 0 warnings\n",
		csvName, bundle.Package, bundle.Channels)
}

type finding struct {
	level  errors.Level
	source string
	text   string
}

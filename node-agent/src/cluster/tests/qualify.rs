//! A shape class requested in `spec.shapeClasses` is qualified (through a fake qualifier: the
//! real self-test needs a GPU) and its result written; a current result is not redone.

use std::sync::Mutex;

use brink_api::crd::ShapeQualification;
use serde_json::json;

use super::*;
use crate::cluster::qualifier::{Qualifier, QualifyError, QualifyJob};

const STATUS: &str = "/apis/brink.dev/v1alpha1/sparknodes/n1/status?&force=true&fieldManager=brink-agent";

/// Answers with a clamped result; records the jobs. Classes named `later-*` cannot run yet.
#[derive(Default)]
struct Fake {
    jobs: Mutex<Vec<QualifyJob>>,
}

impl Qualifier for Fake {
    fn check(&self, job: &QualifyJob) -> Result<(), QualifyError> {
        if job.shape_class.starts_with("later-") {
            Err(QualifyError::Unresolved("no model of this class is in the node's cache yet".into()))
        } else {
            Ok(())
        }
    }

    fn qualify(&self, job: &QualifyJob) -> Result<ShapeQualification, QualifyError> {
        self.jobs.lock().unwrap().push(job.clone());
        Ok(shape_result(&job.shape_class, None))
    }
}

#[tokio::test]
async fn a_requested_class_is_qualified_and_written() {
    let (agent, mut api) = agent();
    let fake = Arc::new(Fake::default());
    let q: Arc<dyn Qualifier> = fake.clone();
    let a = agent.clone();
    let task = tokio::spawn(async move { a.qualify_round(q).await });
    api.expect("GET", "/apis/brink.dev/v1alpha1/sparknodes/n1", 200, spark_node(&["later-c0", "c1", "c2"], None)).await;
    let progress = api.expect("PATCH", STATUS, 200, spark_node(&[], None)).await;
    let p = condition(&progress.body["status"], "Progressing");
    assert_eq!((p["status"].as_str(), p["reason"].as_str()), (Some("True"), Some("Qualifying")));
    assert_eq!(p["message"], "running the kernel self-test for c1 (1 more waiting)");
    let done = api.expect("PATCH", STATUS, 200, spark_node(&[], None)).await;
    let s = &done.body["status"];
    assert_eq!(s["qualifications"].as_array().unwrap().len(), 1);
    let q = &s["qualifications"][0];
    assert_eq!(q["shapeClass"], "c1");
    assert_eq!(q["qualification"]["verdict"], json!({"state": "clamped", "maxTokens": 4096, "firstFailure": 4097}));
    assert_eq!(q["envelope"]["maxBatchTokens"], 4096);
    let qualified = condition(s, "Qualified");
    assert_eq!((qualified["status"].as_str(), qualified["reason"].as_str()), (Some("True"), Some("Qualified")));
    assert_eq!(qualified["message"], "c1 clamped to 4096 tokens (first failure at 4097)");
    let p = condition(s, "Progressing");
    assert_eq!((p["status"].as_str(), p["reason"].as_str()), (Some("False"), Some("WaitingForModel")));
    assert!(p["message"].as_str().unwrap().starts_with("later-c0: no model"), "{p}");
    assert_eq!(finish(task).await.unwrap().as_deref(), Some("c1"));
    let jobs = fake.jobs.lock().unwrap().clone();
    assert_eq!(
        jobs,
        vec![QualifyJob { shape_class: "c1".into(), negative_controls: Ok(()), model_file: None }],
        "no replica resident: negative controls on"
    );

    // The next round takes c2; after it, nothing is left and nothing is written.
    let (a, q) = (agent.clone(), fake.clone() as Arc<dyn Qualifier>);
    let task = tokio::spawn(async move { a.qualify_round(q).await });
    api.expect("GET", "/apis/brink.dev/v1alpha1/sparknodes/n1", 200, spark_node(&["later-c0", "c1", "c2"], None)).await;
    api.expect("PATCH", STATUS, 200, spark_node(&[], None)).await;
    let done = api.expect("PATCH", STATUS, 200, spark_node(&[], None)).await;
    let classes: Vec<&str> =
        done.body["status"]["qualifications"].as_array().unwrap().iter().map(|q| q["shapeClass"].as_str().unwrap()).collect();
    assert_eq!(classes, ["c1", "c2"]);
    assert_eq!(finish(task).await.unwrap().as_deref(), Some("c2"));
    let (a, q) = (agent.clone(), fake.clone() as Arc<dyn Qualifier>);
    let task = tokio::spawn(async move { a.qualify_round(q).await });
    api.expect("GET", "/apis/brink.dev/v1alpha1/sparknodes/n1", 200, spark_node(&["later-c0", "c1", "c2"], None)).await;
    assert_eq!(finish(task).await.unwrap(), None);
    assert_eq!(fake.jobs.lock().unwrap().len(), 2, "a current result is not qualified again");
}

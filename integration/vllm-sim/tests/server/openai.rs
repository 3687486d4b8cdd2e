//! The OpenAI endpoints: shapes of whole and streamed answers, usage, cached tokens, HTTP/2.

use serde_json::{Value, json};

use crate::support::*;

#[tokio::test]
async fn chat_whole_answer_has_vllm_shape_and_usage() {
    let replica = start(small_config()).await;
    let base = replica.url();
    bounded(20, async {
        let content = "Explain continuous batching in one line.";
        let prompt = chat_tokens(&base, content).await;
        let (status, body) = post_json(
            &format!("{base}/v1/chat/completions"),
            &chat_body(content, 7, false),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["object"], "chat.completion");
        assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
        assert!(body["created"].as_u64().unwrap() > 1_600_000_000);
        assert_eq!(body["model"], MODEL);
        let choice = &body["choices"][0];
        assert_eq!(choice["index"], 0);
        assert_eq!(choice["message"]["role"], "assistant");
        assert!(!choice["message"]["content"].as_str().unwrap().is_empty());
        assert_eq!(choice["finish_reason"], "length");
        let usage = &body["usage"];
        assert_eq!(usage["prompt_tokens"], prompt.len());
        assert_eq!(usage["completion_tokens"], 7);
        assert_eq!(usage["total_tokens"], prompt.len() + 7);
        assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
    })
    .await;
    replica.shutdown().await;
}

#[tokio::test]
async fn chat_stream_sends_role_tokens_usage_and_done() {
    let replica = start(small_config()).await;
    let base = replica.url();
    bounded(20, async {
        let content = "Stream me five tokens.";
        let prompt = chat_tokens(&base, content).await;
        let resp = client()
            .post(format!("{base}/v1/chat/completions"))
            .json(&chat_body(content, 5, true))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()["content-type"],
            "text/event-stream; charset=utf-8"
        );
        let data = sse_data(&resp.text().await.unwrap());
        // role chunk + 5 token chunks + usage chunk + [DONE]
        assert_eq!(data.len(), 8, "{data:?}");
        assert_eq!(data.last().unwrap(), "[DONE]");
        let chunks: Vec<Value> = data[..7]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let id = chunks[0]["id"].clone();
        for c in &chunks {
            assert_eq!(c["object"], "chat.completion.chunk");
            assert_eq!(c["id"], id, "one id for all chunks");
            assert_eq!(c["model"], MODEL);
        }
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        for (i, c) in chunks[1..6].iter().enumerate() {
            let choice = &c["choices"][0];
            assert!(choice["delta"].get("role").is_none());
            assert!(!choice["delta"]["content"].as_str().unwrap().is_empty());
            let finish = if i == 4 { json!("length") } else { Value::Null };
            assert_eq!(choice["finish_reason"], finish, "chunk {i}");
        }
        let usage_chunk = &chunks[6];
        assert_eq!(usage_chunk["choices"], json!([]));
        assert_eq!(usage_chunk["usage"]["completion_tokens"], 5);
        assert_eq!(usage_chunk["usage"]["prompt_tokens"], prompt.len());
    })
    .await;
    replica.shutdown().await;
}

#[tokio::test]
async fn completions_whole_and_streamed() {
    let mut config = small_config();
    config.default_max_tokens = 9;
    let replica = start(config).await;
    let base = replica.url();
    bounded(20, async {
        let url = format!("{base}/v1/completions");
        // No max_tokens: the configured default applies.
        let (status, body) =
            post_json(&url, &json!({"model": MODEL, "prompt": "Once upon a time"})).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["object"], "text_completion");
        assert!(body["id"].as_str().unwrap().starts_with("cmpl-"));
        assert!(!body["choices"][0]["text"].as_str().unwrap().is_empty());
        assert_eq!(body["choices"][0]["finish_reason"], "length");
        assert_eq!(body["usage"]["completion_tokens"], 9);
        let prompt = kinference_sim::PseudoTokenizer::encode("Once upon a time");
        assert_eq!(body["usage"]["prompt_tokens"], prompt.len());

        // Token-id prompts are accepted as vLLM accepts them.
        let (status, body) = post_json(
            &url,
            &json!({"model": MODEL, "prompt": [11, 12, 13, 14], "max_tokens": 2}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["usage"]["prompt_tokens"], 4);

        // Streamed, without include_usage: token chunks then [DONE], no usage chunk.
        let resp = client()
            .post(&url)
            .json(&json!({"model": MODEL, "prompt": "abc def", "max_tokens": 3, "stream": true}))
            .send()
            .await
            .unwrap();
        let data = sse_data(&resp.text().await.unwrap());
        assert_eq!(data.len(), 4, "{data:?}");
        assert_eq!(data[3], "[DONE]");
        for (i, d) in data[..3].iter().enumerate() {
            let c: Value = serde_json::from_str(d).unwrap();
            assert_eq!(c["object"], "text_completion");
            assert!(c.get("usage").is_none());
            assert!(!c["choices"][0]["text"].as_str().unwrap().is_empty());
            let finish = if i == 2 { json!("length") } else { Value::Null };
            assert_eq!(c["choices"][0]["finish_reason"], finish);
        }
    })
    .await;
    replica.shutdown().await;
}

#[tokio::test]
async fn max_completion_tokens_wins_over_max_tokens() {
    let replica = start(small_config()).await;
    let base = replica.url();
    bounded(20, async {
        let (status, body) = post_json(
            &format!("{base}/v1/chat/completions"),
            &json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                    "max_tokens": 9, "max_completion_tokens": 4}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["usage"]["completion_tokens"], 4);
    })
    .await;
    replica.shutdown().await;
}

#[tokio::test]
async fn repeated_long_prompt_reports_the_engines_cached_tokens() {
    let replica = start(small_config()).await;
    let base = replica.url();
    bounded(20, async {
        let content = long_text(300, "w");
        let prompt = chat_tokens(&base, &content).await;
        assert!(prompt.len() > 300, "a long prompt: {} tokens", prompt.len());
        let url = format!("{base}/v1/chat/completions");
        let (status, first) = post_json(&url, &chat_body(&content, 2, false)).await;
        assert_eq!(status, 200, "{first}");
        assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

        let expected = replica.cached_prefix_tokens(&prompt, None);
        // All full blocks of the prompt but the engine always computes the last token.
        assert!(expected > 0);
        assert_eq!(expected % 16, 0, "whole blocks");
        assert!(expected as usize >= prompt.len() - 16 - 1);

        let (status, second) = post_json(&url, &chat_body(&content, 2, true)).await;
        assert_eq!(status, 200, "{second}");
        // Streamed with include_usage; check the usage chunk.
        let data = sse_data(second.as_str().unwrap());
        let usage: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
        assert_eq!(
            usage["usage"]["prompt_tokens_details"]["cached_tokens"],
            expected
        );

        // The same prompt through an adapter hashes differently: nothing cached.
        let mut body = chat_body(&content, 2, false);
        body["model"] = json!("sql-lora");
        let (status, lora) = post_json(&url, &body).await;
        assert_eq!(status, 200, "{lora}");
        assert_eq!(lora["model"], "sql-lora");
        assert_eq!(lora["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    })
    .await;
    replica.shutdown().await;
}

#[tokio::test]
async fn http2_prior_knowledge_streams() {
    let replica = start(small_config()).await;
    let base = replica.url();
    bounded(20, async {
        let h2 = reqwest::Client::builder()
            .http2_prior_knowledge()
            .build()
            .unwrap();
        let resp = h2
            .post(format!("{base}/v1/chat/completions"))
            .json(&chat_body("over h2", 3, true))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.version(), reqwest::Version::HTTP_2);
        assert_eq!(resp.status(), 200);
        let data = sse_data(&resp.text().await.unwrap());
        assert_eq!(data.len(), 6, "{data:?}");
        assert_eq!(data[5], "[DONE]");

        let resp = h2.get(format!("{base}/v1/models")).send().await.unwrap();
        assert_eq!(resp.version(), reqwest::Version::HTTP_2);
        assert_eq!(resp.status(), 200);
    })
    .await;
    replica.shutdown().await;
}

#[tokio::test]
async fn models_tokenize_and_health() {
    let replica = start(small_config()).await;
    let base = replica.url();
    bounded(20, async {
        let models = get_json(&format!("{base}/v1/models")).await;
        assert_eq!(models["object"], "list");
        let data = models["data"].as_array().unwrap();
        assert_eq!(data.len(), 2);
        assert_eq!(data[0]["id"], MODEL);
        assert_eq!(data[0]["object"], "model");
        assert_eq!(data[0]["owned_by"], "vllm");
        assert_eq!(data[0]["max_model_len"], 2048);
        assert_eq!(data[1]["id"], "sql-lora");
        assert_eq!(data[1]["parent"], MODEL);

        let (status, body) = post_json(
            &format!("{base}/tokenize"),
            &json!({"prompt": "hello world, hello tokens"}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let expected = kinference_sim::PseudoTokenizer::encode("hello world, hello tokens");
        assert_eq!(body["count"], expected.len());
        assert_eq!(body["max_model_len"], 2048);
        assert_eq!(body["tokens"], json!(expected));

        let (status, body) = post_json(
            &format!("{base}/tokenize"),
            &json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let chat = kinference_sim::tokenizer::chat_prompt(&[("user", "hi")]);
        assert_eq!(
            body["tokens"],
            json!(kinference_sim::PseudoTokenizer::encode(&chat))
        );

        let resp = client().get(format!("{base}/health")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
    })
    .await;
    replica.shutdown().await;
}

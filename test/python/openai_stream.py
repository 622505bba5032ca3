"""Stream a chat completion from an inferlb engine simulator with the official
OpenAI Python client, and print what the client saw as one JSON object.

Usage: openai_stream.py BASE_URL   (e.g. http://127.0.0.1:40123)

The Go test tools/enginesim (TestOpenAIPythonClient) runs this with the
project's virtual environment and checks the output.
"""

import json
import sys

from openai import OpenAI


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: openai_stream.py BASE_URL", file=sys.stderr)
        return 2
    client = OpenAI(base_url=sys.argv[1].rstrip("/") + "/v1", api_key="unused", max_retries=0, timeout=30)
    models = [m.id for m in client.models.list()]
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Tell me about load balancing for inference engines."},
    ]
    out = {"models": models, "turns": []}
    for _ in range(2):  # the second turn repeats the prefix: cached tokens rise
        stream = client.chat.completions.create(
            model=models[0],
            messages=messages,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
        content, finish, usage, roles, chunks = "", None, None, [], 0
        for chunk in stream:
            chunks += 1
            if chunk.usage is not None:
                usage = {
                    "prompt_tokens": chunk.usage.prompt_tokens,
                    "completion_tokens": chunk.usage.completion_tokens,
                    "total_tokens": chunk.usage.total_tokens,
                    "cached_tokens": chunk.usage.prompt_tokens_details.cached_tokens,
                }
            for choice in chunk.choices:
                if choice.delta.role:
                    roles.append(choice.delta.role)
                if choice.delta.content:
                    content += choice.delta.content
                if choice.finish_reason:
                    finish = choice.finish_reason
        out["turns"].append(
            {"content": content, "finish_reason": finish, "usage": usage, "roles": roles, "chunks": chunks}
        )
    whole = client.chat.completions.create(model=models[0], messages=messages, max_tokens=4)
    out["whole"] = {
        "content": whole.choices[0].message.content,
        "finish_reason": whole.choices[0].finish_reason,
        "completion_tokens": whole.usage.completion_tokens,
    }
    try:
        client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=4)
        out["unknown_model_error"] = None
    except Exception as e:  # the client's NotFoundError
        out["unknown_model_error"] = {"class": type(e).__name__, "status": getattr(e, "status_code", None)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

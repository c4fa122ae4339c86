"""Pydantic models of every request and response body: they validate what the gateway reads (fields it
does not know pass through to the backend untouched) and they are what the OpenAPI document shows."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator

PASS_THROUGH = ConfigDict(extra="allow")
CLOSED = ConfigDict(extra="forbid")
# a JSON number, integer or not (strict: never a boolean or a string); one type, so that its bounds
# appear in the OpenAPI document as minimum and maximum
Number = StrictFloat
Positive = Annotated[StrictInt, Field(ge=1)]
Text = Annotated[StrictStr, Field(min_length=1)]


class ContentPart(BaseModel):
    model_config = PASS_THROUGH
    type: StrictStr
    text: StrictStr | None = None

    @model_validator(mode="after")
    def _text_part_has_text(self):
        if self.type == "text" and self.text is None:
            raise ValueError("a content part of type 'text' needs a string 'text'")
        return self


class ChatMessage(BaseModel):
    model_config = PASS_THROUGH
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: StrictStr | list[ContentPart] | None = None
    name: StrictStr | None = None


class StreamOptions(BaseModel):
    model_config = CLOSED
    include_usage: StrictBool | None = None
    continuous_usage_stats: StrictBool | None = None


class Sampling(BaseModel):
    """Fields shared by chat and text completions that the gateway reads or must keep sane."""

    model_config = PASS_THROUGH
    model: StrictStr = Field(min_length=1)
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: Positive | None = None
    n: Annotated[StrictInt, Field(ge=1, le=128)] | None = None
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = None
    top_p: Annotated[Number, Field(ge=0, le=1)] | None = None
    presence_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = None
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    user: StrictStr | None = None


class ChatCompletionRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Positive | None = None


TokenIds = Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)]
# a prompt or embedding input: text, texts, token ids or lists of token ids, none of them empty (the
# document says so, so that a generated "valid" request is one a backend accepts)
Prompts = Text | Annotated[list[Text], Field(min_length=1)] | TokenIds | Annotated[list[TokenIds], Field(min_length=1)]


class CompletionRequest(Sampling):
    prompt: Prompts
    best_of: Annotated[StrictInt, Field(ge=1, le=128)] | None = None
    echo: StrictBool | None = None
    logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | None = None
    max_completion_tokens: Positive | None = Field(
        default=None, description="Not honoured by vLLM's completions endpoint (max_tokens is); reserved anyway"
    )


class EmbeddingRequest(BaseModel):
    model_config = PASS_THROUGH
    model: StrictStr = Field(min_length=1)
    input: Prompts
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Positive | None = None
    user: StrictStr | None = None


# responses (documented, not validated on the hot path)
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int


class ChatChoice(BaseModel):
    index: int
    message: dict[str, Any]
    finish_reason: str | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: str | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class Embedding(BaseModel):
    index: int
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | str


class EmbeddingList(BaseModel):
    object: Literal["list"] = "list"
    model: str
    data: list[Embedding]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "mlplane"
    regions: list[str]


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


# Open Inference Protocol v2
class InferTensor(BaseModel):
    model_config = PASS_THROUGH
    name: StrictStr
    shape: list[Annotated[StrictInt, Field(ge=0)]]
    datatype: StrictStr
    data: list[Any]
    parameters: dict[str, Any] | None = None


class InferRequest(BaseModel):
    model_config = PASS_THROUGH
    id: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    inputs: list[InferTensor] = Field(min_length=1)
    outputs: list[dict[str, Any]] | None = None


class V2Error(BaseModel):
    """A v2 backend's own refusal, passed on as it came (the protocol's error shape)."""

    error: str


class InferResponse(BaseModel):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    outputs: list[dict[str, Any]]


class V2ModelMetadata(BaseModel):
    name: str
    versions: list[str] | None = None
    platform: str
    inputs: list[dict[str, Any]] = []
    outputs: list[dict[str, Any]] = []


# admin
class Limits(BaseModel):
    model_config = CLOSED
    rpm: Positive | None = None
    tpm: Positive | None = None
    rpd: Positive | None = None
    tpd: Positive | None = None


class KeyCreate(Limits):
    owner: StrictStr = Field(min_length=1, max_length=200)
    team: StrictStr = Field(min_length=1, max_length=200)
    models: list[Annotated[StrictStr, Field(min_length=1)]] = []
    expires_at: Number | None = Field(default=None, description="Unix time")


class TeamSet(Limits):
    team: StrictStr = Field(min_length=1, max_length=200)


class KeyRecord(BaseModel):
    key_id: str
    owner: str
    team: str
    models: list[str]
    rpm: int | None = None
    tpm: int | None = None
    rpd: int | None = None
    tpd: int | None = None
    expires_at: float | None = None
    revoked_at: float | None = None
    created_at: float
    rotated_at: float | None = None


class KeyWithSecret(KeyRecord):
    key: str = Field(description="The secret, shown once")


class TeamRecord(Limits):
    model_config = ConfigDict(extra="ignore")
    team: str
    updated_at: float = 0.0


class KeyList(BaseModel):
    data: list[KeyRecord]


class TeamList(BaseModel):
    data: list[TeamRecord]


class UsageRows(BaseModel):
    data: list[dict[str, Any]]


class Reloaded(BaseModel):
    models: list[str]


OPENAPI_MODELS = (ChatCompletionRequest, CompletionRequest, EmbeddingRequest, InferRequest, KeyCreate, TeamSet)

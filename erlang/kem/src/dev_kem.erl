%%% @doc The `kem@1.0' HyperBEAM device: WGSL compute kernels, named by
%%% Arweave ID, run on the node's GPU through the `kem' application.
%%%
%%% Keys (all `(Msg1, Msg2, Opts)'):
%%% - `execute_kernel': `kernel-id', `input-data', `output-size-hint'
%%%   (default 1);
%%% - `execute_kernel_with_params': the same plus `params' (u32 values,
%%%   packed as 32-bit little-endian words);
%%% - `get_adapter_info': the adapter as JSON; `info': a description (JSON).
%%%
%%% A request comes in one of two forms (docs/hyperbeam.md):
%%% - a JSON body `{"kernel_id", "input_data": [bytes], ...}' (the
%%%   original's), read from Msg2's `body', then Msg1's (over HTTP it is in
%%%   both; in a direct `hb_ao:resolve' only in Msg2);
%%% - the input bytes as the body with `content-type:
%%%   application/octet-stream' and the other fields as message keys.
%%% Field names are accepted kebab-case (HyperBEAM's) or snake_case (the
%%% original's). Fields may also all be message keys, without a body.
%%%
%%% Success is a 200 with the raw result bytes and the call's usage as
%%% `kem-usage-*' keys. A failure carries `status', `error', `reason' and
%%% `details' as top-level keys (HTTP headers) and the same as a JSON body:
%%% a bad request is a 4xx naming the problem, a failure to run a 5xx.
%%% Nothing in a reply names a node path.
-module(dev_kem).

-export([info/1, info/3, execute_kernel/3, execute_kernel_with_params/3,
         get_adapter_info/3, execute_chain/3]).

-define(FIELDS, [kernel_id, input_data, output_size_hint, params]).

%% @doc Only these keys are reachable through the device.
-spec info(term()) -> map().
info(_) ->
    #{exports => [info, execute_kernel, execute_kernel_with_params, get_adapter_info, execute_chain]}.

-spec info(map(), map(), map()) -> {ok, map()}.
info(_Msg1, _Msg2, _Opts) ->
    json_reply(200, #{
        <<"description">> => <<"Kernel execution machine: runs WGSL compute kernels on the node's GPU">>,
        <<"version">> => <<"1.0">>,
        <<"kem-version">> => kem_version:app_vsn(),
        <<"health">> => kem_health:summary(),
        <<"paths">> => #{
            <<"info">> => <<"this description">>,
            <<"execute_kernel">> =>
                <<"POST JSON {kernel-id, input-data, output-size-hint}, or the input bytes "
                  "(content-type: application/octet-stream) with the other fields as keys">>,
            <<"execute_kernel_with_params">> => <<"POST as execute_kernel, with params [u32]">>,
            <<"get_adapter_info">> => <<"GPU adapter and limits as JSON">>,
            <<"execute_chain">> => <<"POST JSON {input-data, steps: [{kernel-id, ...}]}: one GPU submission">>}}).

-spec execute_kernel(map(), map(), map()) -> {ok, map()} | {error, map()}.
execute_kernel(Msg1, Msg2, Opts) ->
    handle(execute_kernel, Msg1, Msg2, Opts).

-spec execute_kernel_with_params(map(), map(), map()) -> {ok, map()} | {error, map()}.
execute_kernel_with_params(Msg1, Msg2, Opts) ->
    handle(execute_kernel_with_params, Msg1, Msg2, Opts).

-spec get_adapter_info(map(), map(), map()) -> {ok, map()} | {error, map()}.
get_adapter_info(_Msg1, _Msg2, _Opts) ->
    case kem:adapter_info() of
        {ok, Json} ->
            case kem_json:decode(Json) of
                {ok, Info} when is_map(Info) -> json_reply(200, kem_adapter:public(Info));
                _ -> failure(<<"Failed to get adapter info">>, {bad_reply, <<"adapter info is not JSON">>})
            end;
        {error, Reason} ->
            failure(<<"Failed to get adapter info">>, Reason)
    end.

%% @doc A stateless chain of kernels in one request, one GPU submission
%% (dev_kem_chain reads the body; docs/sessions.md).
-spec execute_chain(map(), map(), map()) -> {ok, map()} | {error, map()}.
execute_chain(Msg1, Msg2, Opts) ->
    event(kem, {request, execute_chain}),
    Body = try chain_body(first_found([<<"body">>], [Msg2, Msg1], Opts))
           catch throw:{bad_request, _, _, Why} -> {bad_request, Why}
           end,
    case dev_kem_chain:request(Body) of
        {ok, Steps, ChainOpts} ->
            case kem:request_chain_usage(Steps, ChainOpts) of
                {{ok, Result}, Usage} ->
                    success(Result, Usage, Opts);
                {{error, Reason}, _Usage} ->
                    event(kem, {failed, execute_chain, Reason}),
                    failure(<<"Failed to execute chain">>, dev_kem_chain:flat_reason(Reason))
            end;
        {bad_request, Detail} ->
            error_reply(400, <<"Bad request">>, bad_request, Detail)
    end.

chain_body(Body) when is_binary(Body), Body =/= <<>> -> json_object(Body);
chain_body(Map) when is_map(Map) -> Map;
chain_body(_) -> bad(<<"a JSON body {input-data, steps} is required">>).

%%% request handling

handle(Key, Msg1, Msg2, Opts) ->
    event(kem, {request, Key}),
    case request(Key, Msg1, Msg2, Opts) of
        {ok, Method, Args} ->
            case kem:request_usage(Method, Args) of
                {{ok, Result}, Usage} ->
                    success(Result, Usage, Opts);
                {{error, Reason}, _Usage} ->
                    event(kem, {failed, Key, Reason}),
                    failure(<<"Failed to execute kernel">>, Reason)
            end;
        {bad_request, Status, Reason, Detail} ->
            event(kem, {bad_request, Key, Detail}),
            error_reply(Status, <<"Bad request">>, Reason, Detail)
    end.

request(Key, Msg1, Msg2, Opts) ->
    try
        Fields = fields(Msg1, Msg2, Opts),
        args(Key, Fields)
    catch
        throw:{bad_request, Status, Reason, Detail} -> {bad_request, Status, Reason, Detail}
    end.

%% A binary body with content-type application/octet-stream is the input;
%% another binary body is JSON; a map body is the fields; else the fields
%% are message keys. Returns a map of canonical (atom) field names.
fields(Msg1, Msg2, Opts) ->
    Msgs = [Msg2, Msg1],
    case first_found([<<"body">>], Msgs, Opts) of
        Body when is_binary(Body), Body =/= <<>> ->
            case is_octet_stream(first_found([<<"content-type">>], Msgs, Opts)) of
                true -> (key_fields(Msgs, Opts))#{input_data => Body};
                false -> canonical(json_object(Body))
            end;
        Map when is_map(Map) ->
            canonical(Map);
        _ ->
            case key_fields(Msgs, Opts) of
                Empty when map_size(Empty) =:= 0 ->
                    bad(<<"no body and no kernel-id field">>);
                Found ->
                    Found
            end
    end.

json_object(Body) ->
    case kem_json:decode(Body) of
        {ok, Map} when is_map(Map) -> Map;
        {ok, _} -> bad(<<"body must be a JSON object">>);
        {error, Detail} -> bad(Detail)
    end.

%% The fields given as message keys, kebab-case first.
key_fields(Msgs, Opts) ->
    maps:from_list([{F, V} || F <- ?FIELDS,
                              V <- [first_found(names(F), Msgs, Opts)], V =/= not_found]).

canonical(Map) ->
    maps:from_list([{F, V} || F <- ?FIELDS, V <- [first_key(names(F), Map)], V =/= not_found]).

first_key([], _Map) -> not_found;
first_key([Name | Rest], Map) ->
    case maps:find(Name, Map) of
        {ok, V} -> V;
        error -> first_key(Rest, Map)
    end.

%% Kebab-case (HyperBEAM) and snake_case (the original) names of a field.
names(Field) ->
    Snake = atom_to_binary(Field, utf8),
    Kebab = binary:replace(Snake, <<"_">>, <<"-">>, [global]),
    lists:usort([Kebab, Snake]).

is_octet_stream(CT) when is_binary(CT) ->
    string:prefix(string:lowercase(CT), <<"application/octet-stream">>) =/= nomatch;
is_octet_stream(_) -> false.

args(Key, Fields) ->
    KernelId = kernel_id(maps:get(kernel_id, Fields, missing)),
    Input = input_data(maps:get(input_data, Fields, missing)),
    case Key of
        execute_kernel ->
            Hint = hint(maps:get(output_size_hint, Fields, 1)),
            {ok, execute_kernel, {KernelId, Input, Hint}};
        execute_kernel_with_params ->
            Params = params(maps:get(params, Fields, missing)),
            ok = not_an_image_file(Input),
            {ok, execute_kernel_with_params, {KernelId, Input, Params}}
    end.

kernel_id(Id) when is_binary(Id), Id =/= <<>> -> Id;
kernel_id(missing) -> bad(<<"kernel-id is required">>);
kernel_id(_) -> bad(<<"kernel-id must be a non-empty string">>).

input_data(List) when is_list(List) ->
    case lists:all(fun(B) -> is_integer(B) andalso B >= 0 andalso B =< 255 end, List) of
        true -> list_to_binary(List);
        false -> bad(<<"input-data must be an array of integers 0-255">>)
    end;
input_data(Bin) when is_binary(Bin) -> Bin;  % a message key or an octet-stream body: raw bytes
input_data(missing) -> bad(<<"input-data is required">>);
input_data(_) -> bad(<<"input-data must be an array of integers 0-255">>).

hint(N) when is_integer(N), N > 0 -> N;
hint(Bin) when is_binary(Bin) ->
    try binary_to_integer(string:trim(Bin)) of
        N -> hint(N)
    catch error:badarg -> bad(<<"output-size-hint must be an integer > 0">>)
    end;
hint(_) -> bad(<<"output-size-hint must be an integer > 0">>).

params(List) when is_list(List), List =/= [] ->
    case lists:all(fun(X) -> is_integer(X) andalso X >= 0 andalso X =< 16#FFFFFFFF end, List) of
        true -> << <<X:32/little>> || X <- List >>;
        false -> bad(<<"params must be an array of integers 0..4294967295">>)
    end;
params(Bin) when is_binary(Bin) ->
    %% As a message key (an HTTP header): "10,10,4,0".
    try [binary_to_integer(string:trim(P)) || P <- binary:split(Bin, <<",">>, [global])] of
        List -> params(List)
    catch error:badarg -> bad(<<"params must be comma-separated integers 0..4294967295">>)
    end;
params(missing) -> bad(<<"params is required">>);
params(_) -> bad(<<"params must be a non-empty array of integers 0..4294967295">>).

%% Image kernels take raw RGBA8 pixels; the original decoded PNG/JPEG files
%% in the NIF. Say so instead of running a kernel over compressed bytes.
not_an_image_file(<<16#89, "PNG", 16#0D, 16#0A, 16#1A, 16#0A, _/binary>>) ->
    bad(415, encoded_image, <<"input-data is an encoded PNG file: send raw RGBA8 pixels (width*height*4 bytes)">>);
not_an_image_file(<<16#FF, 16#D8, 16#FF, _/binary>>) ->
    bad(415, encoded_image, <<"input-data is an encoded JPEG file: send raw RGBA8 pixels (width*height*4 bytes)">>);
not_an_image_file(_) -> ok.

-spec bad(binary()) -> no_return().
bad(Detail) -> bad(400, bad_request, Detail).

-spec bad(400..499, atom(), binary()) -> no_return().
bad(Status, Reason, Detail) -> throw({bad_request, Status, Reason, Detail}).

%%% replies

%% A 200 with the result bytes; the usage metered and as headers.
success(Result, Usage, Opts) ->
    kem_metering:report(Usage, Opts),
    {ok, maps:merge(usage_keys(Usage),
                    #{<<"status">> => 200, <<"body">> => Result,
                      <<"content-type">> => <<"application/octet-stream">>})}.

usage_keys(Usage = #{kernel_id := K, bytes_in := In, bytes_out := Out, us := Us, clock := Clock}) ->
    #{<<"kem-usage-kernel-id">> => K,
      <<"kem-usage-node">> => atom_to_binary(maps:get(node, Usage, node()), utf8),
      <<"kem-usage-bytes-in">> => In,
      <<"kem-usage-bytes-out">> => Out,
      <<"kem-usage-us">> => Us,
      <<"kem-usage-clock">> => atom_to_binary(Clock, utf8)}.

failure(Message, {Reason, Detail}) when is_atom(Reason) ->
    retry_after(Reason, error_reply(status(Reason), Message, Reason, Detail));
failure(Message, Other) ->
    error_reply(500, Message, internal, Other).

%% The fields at the top level, where HyperBEAM's httpsig codec makes them
%% headers, and again as a JSON body: a map body would become a link plus
%% the node's HTML index page.
error_reply(Status, Message, Reason, Detail) ->
    Fields = #{<<"error">> => Message,
               <<"reason">> => atom_to_binary(Reason, utf8),
               <<"details">> => kem_redact:text(Detail)},
    {error, Fields#{<<"status">> => Status,
                    <<"content-type">> => <<"application/json">>,
                    <<"body">> => kem_json:encode(Fields)}}.

%% A port being replaced (a warm spare takes over within ms, docs/
%% reliability.md): the same request may be sent again, so say when. A
%% top-level binary becomes a header (httpsig); HTTP's unit is 1 s. Not
%% for `session_lost': that session is gone, a retry needs a new one.
retry_after(Reason, {error, Fields}) when Reason =:= port_exited; Reason =:= port_restarted;
                                         Reason =:= port_unavailable ->
    {error, Fields#{<<"retry-after">> => <<"1">>}};
retry_after(_Reason, Reply) ->
    Reply.

json_reply(Status, Map) ->
    {ok, #{<<"status">> => Status,
           <<"content-type">> => <<"application/json">>,
           <<"body">> => kem_json:encode(Map)}}.

%% Who must act: the requester (4xx) or the node (5xx). An unknown kernel
%% is a 400, not a 404: HyperBEAM replaces every 404 reply sent with its
%% default codec by its own HTML page, and the reason would be lost.
status(bad_request) -> 400;
status(bad_args) -> 400;
status(invalid_kernel_id) -> 400;
status(kernel_not_found) -> 400;
status(not_found) -> 400;
status(too_large) -> 413;
status(not_pinned) -> 403;
status(owner_not_allowed) -> 403;
status(shader_error) -> 422;
status(bad_kernel) -> 422;
status(dispatch_too_large) -> 422;
status(kernel_rejected) -> 422;
status(no_buffer) -> 400;
status(quota_exceeded) -> 413;
status(overloaded) -> 503;
status(quarantined) -> 503;
status(port_unavailable) -> 503;
%% The node's port died or was replaced under the call: the node's fault,
%% and passing (503), not a bug (500).
status(port_exited) -> 503;
status(port_restarted) -> 503;
status(session_lost) -> 503;
status(not_started) -> 503;
status(no_kem_node) -> 503;
status(no_local_gpu) -> 503;
status(timeout) -> 504;
status(Reason) ->
    %% Every gateway failed to prove the kernel: the fault is upstream.
    case lists:member(Reason, [id_mismatch, bad_signature, data_root_mismatch, size_mismatch,
                               header_unavailable, bad_header, pin_mismatch,
                               unsupported_signature_type, fetch_failed, unreachable,
                               http_error, bad_response]) of
        true -> 502;
        false -> 500
    end.

%%% HyperBEAM integration, optional outside a node

first_found(_Names, [], _Opts) -> not_found;
first_found(Names, [Msg | Rest], Opts) ->
    case get_any(Names, Msg, Opts) of
        not_found -> first_found(Names, Rest, Opts);
        Value -> Value
    end.

get_any([], _Msg, _Opts) -> not_found;
get_any([Name | Rest], Msg, Opts) ->
    case get(Name, Msg, Opts) of
        not_found -> get_any(Rest, Msg, Opts);
        Value -> Value
    end.

%% A plain field read: inside a node `hb_maps:get/4' (it loads links but
%% never dispatches to the message's device, which would be kem@1.0
%% itself), else `maps:get/3'.
get(Key, Msg, Opts) when is_map(Msg) ->
    case kem_optional:has(hb_maps, get, 4) of
        true -> hb_maps:get(Key, Msg, not_found, Opts);
        false -> maps:get(Key, Msg, not_found)
    end;
get(_Key, _Msg, _Opts) -> not_found.

event(Topic, Term) ->
    case kem_optional:has(hb_event, log, 5) of
        true -> hb_event:log(Topic, Term, ?MODULE, ?FUNCTION_NAME, ?LINE);
        false -> logger:debug("~p: ~p", [Topic, Term])
    end.

%%% tests

-ifdef(TEST).
-include_lib("eunit/include/eunit.hrl").

%% Every reason the port or kem can give maps to the side that must act:
%% the requester (4xx) for what a request or its kernel did, the node or an
%% upstream gateway (5xx) for what failed to run.
status_by_reason_test() ->
    Client = [bad_args, invalid_kernel_id, kernel_not_found, too_large, shader_error,
              bad_kernel, kernel_rejected, no_buffer, quota_exceeded, not_pinned],
    [?assert(status(R) >= 400 andalso status(R) < 500) || R <- Client],
    ?assertEqual(422, status(kernel_rejected)),
    ?assertEqual(503, status(quarantined)),
    ?assertEqual(502, status(bad_response)),
    ?assertEqual(502, status(fetch_failed)),
    ?assertEqual(500, status(internal)).

%% A restarting port is a 503 with a JSON body and a Retry-After header; a
%% lost session is a 503 without one (sending it again cannot help).
restart_replies_test() ->
    [begin
         {error, Reply} = failure(<<"kem call failed">>, {Reason, <<"the port is restarting">>}),
         ?assertMatch(#{<<"status">> := 503, <<"retry-after">> := <<"1">>,
                        <<"content-type">> := <<"application/json">>}, Reply),
         ?assertMatch({ok, #{<<"reason">> := _}}, kem_json:decode(maps:get(<<"body">>, Reply)))
     end || Reason <- [port_exited, port_restarted, port_unavailable]],
    {error, Lost} = failure(<<"kem call failed">>, {session_lost, <<"the port that held this session exited">>}),
    ?assertMatch(#{<<"status">> := 503}, Lost),
    ?assertNot(maps:is_key(<<"retry-after">>, Lost)),
    {error, Internal} = failure(<<"kem call failed">>, {internal, <<"x">>}),
    ?assertMatch(#{<<"status">> := 500}, Internal),
    ?assertNot(maps:is_key(<<"retry-after">>, Internal)).
-endif.

%%% @doc The `kem@1.0' HyperBEAM device: WGSL compute kernels, named by
%%% Arweave ID, run on the node's GPU through the `kem' application.
%%%
%%% Keys (all `(Msg1, Msg2, Opts)'):
%%% - `execute_kernel': JSON body `{"kernel_id", "input_data": [bytes],
%%%   "output_size_hint": N}' (hint defaults to 1);
%%% - `execute_kernel_with_params': the same plus `"params": [u32, ...]',
%%%   packed as 32-bit little-endian words;
%%% - `get_adapter_info': the adapter as JSON; `info': a description.
%%% The request is read from Msg2's `body', then Msg1's (over HTTP it is in
%%% both; in a direct `hb_ao:resolve' only in Msg2); the same fields may also
%%% be given as message keys. Success is a 200 with the raw result bytes;
%%% a bad request is a 4xx naming the problem, a failure to run a 5xx.
-module(dev_kem).

-export([info/1, info/3, execute_kernel/3, execute_kernel_with_params/3,
         get_adapter_info/3]).

-define(FIELDS, [<<"kernel_id">>, <<"input_data">>, <<"output_size_hint">>, <<"params">>]).

%% @doc Only these keys are reachable through the device.
-spec info(term()) -> map().
info(_) ->
    #{exports => [info, execute_kernel, execute_kernel_with_params, get_adapter_info]}.

-spec info(map(), map(), map()) -> {ok, map()}.
info(_Msg1, _Msg2, _Opts) ->
    {ok, #{<<"status">> => 200,
           <<"body">> => #{
               <<"description">> => <<"Kernel execution machine: runs WGSL compute kernels on the node's GPU">>,
               <<"version">> => <<"1.0">>,
               <<"paths">> => #{
                   <<"info">> => <<"this description">>,
                   <<"execute_kernel">> => <<"POST {kernel_id, input_data, output_size_hint}">>,
                   <<"execute_kernel_with_params">> => <<"POST {kernel_id, input_data, params}">>,
                   <<"get_adapter_info">> => <<"GPU adapter and limits as JSON">>}}}}.

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
            {ok, #{<<"status">> => 200, <<"body">> => Json,
                   <<"content-type">> => <<"application/json">>}};
        {error, Reason} ->
            failure(<<"Failed to get adapter info">>, Reason)
    end.

%%% request handling

handle(Key, Msg1, Msg2, Opts) ->
    event(kem, {request, Key}),
    case request(Key, Msg1, Msg2, Opts) of
        {ok, Method, Args} ->
            case kem:call(Method, Args, application:get_env(kem, timeout, 30000)) of
                {ok, Result} ->
                    {ok, #{<<"status">> => 200, <<"body">> => Result,
                           <<"content-type">> => <<"application/octet-stream">>}};
                {error, Reason} ->
                    event(kem, {failed, Key, Reason}),
                    failure(<<"Failed to execute kernel">>, Reason)
            end;
        {bad_request, Detail} ->
            event(kem, {bad_request, Key, Detail}),
            {error, error_body(400, <<"Bad request">>, bad_request, Detail)}
    end.

request(Key, Msg1, Msg2, Opts) ->
    case fields(Msg1, Msg2, Opts) of
        {ok, Fields} -> args(Key, Fields);
        Bad -> Bad
    end.

%% The JSON body of Msg2, then Msg1; else the fields as message keys.
fields(Msg1, Msg2, Opts) ->
    case first_found(<<"body">>, [Msg2, Msg1], Opts) of
        Body when is_binary(Body), Body =/= <<>> ->
            case kem_json:decode(Body) of
                {ok, Map} when is_map(Map) -> {ok, Map};
                {ok, _} -> {bad_request, <<"body must be a JSON object">>};
                {error, Detail} -> {bad_request, Detail}
            end;
        Map when is_map(Map) ->
            {ok, Map};
        _ ->
            Found = [{F, V} || F <- ?FIELDS, V <- [first_found(F, [Msg2, Msg1], Opts)], V =/= not_found],
            case Found of
                [] -> {bad_request, <<"no JSON body and no kernel_id field">>};
                _ -> {ok, maps:from_list(Found)}
            end
    end.

args(Key, Fields) ->
    try
        KernelId = kernel_id(maps:get(<<"kernel_id">>, Fields, missing)),
        Input = input_data(maps:get(<<"input_data">>, Fields, missing)),
        case Key of
            execute_kernel ->
                Hint = hint(maps:get(<<"output_size_hint">>, Fields, 1)),
                {ok, execute_kernel, {KernelId, Input, Hint}};
            execute_kernel_with_params ->
                Params = params(maps:get(<<"params">>, Fields, missing)),
                {ok, execute_kernel_with_params, {KernelId, Input, Params}}
        end
    catch
        throw:{bad_request, Detail} -> {bad_request, Detail}
    end.

kernel_id(Id) when is_binary(Id), Id =/= <<>> -> Id;
kernel_id(missing) -> bad(<<"kernel_id is required">>);
kernel_id(_) -> bad(<<"kernel_id must be a non-empty string">>).

input_data(List) when is_list(List) ->
    case lists:all(fun(B) -> is_integer(B) andalso B >= 0 andalso B =< 255 end, List) of
        true -> list_to_binary(List);
        false -> bad(<<"input_data must be an array of integers 0-255">>)
    end;
input_data(Bin) when is_binary(Bin) -> Bin;  % given as a message key: raw bytes
input_data(missing) -> bad(<<"input_data is required">>);
input_data(_) -> bad(<<"input_data must be an array of integers 0-255">>).

hint(N) when is_integer(N), N > 0 -> N;
hint(Bin) when is_binary(Bin) ->
    try binary_to_integer(Bin) of
        N -> hint(N)
    catch error:badarg -> bad(<<"output_size_hint must be an integer > 0">>)
    end;
hint(_) -> bad(<<"output_size_hint must be an integer > 0">>).

params(List) when is_list(List), List =/= [] ->
    case lists:all(fun(X) -> is_integer(X) andalso X >= 0 andalso X =< 16#FFFFFFFF end, List) of
        true -> << <<X:32/little>> || X <- List >>;
        false -> bad(<<"params must be an array of integers 0..4294967295">>)
    end;
params(missing) -> bad(<<"params is required">>);
params(_) -> bad(<<"params must be a non-empty array of integers 0..4294967295">>).

-spec bad(binary()) -> no_return().
bad(Detail) -> throw({bad_request, Detail}).

%%% replies

failure(Message, {Reason, Detail}) when is_atom(Reason) ->
    {error, error_body(status(Reason), Message, Reason, Detail)};
failure(Message, Other) ->
    {error, error_body(500, Message, internal, Other)}.

error_body(Status, Message, Reason, Detail) ->
    #{<<"status">> => Status,
      <<"body">> => #{<<"error">> => Message,
                      <<"reason">> => atom_to_binary(Reason, utf8),
                      <<"details">> => to_text(Detail)}}.

%% Who must act: the requester (4xx) or the node (5xx).
status(bad_request) -> 400;
status(bad_args) -> 400;
status(invalid_kernel_id) -> 400;
status(kernel_not_found) -> 404;
status(too_large) -> 413;
status(not_found) -> 404;
status(not_pinned) -> 403;
status(owner_not_allowed) -> 403;
status(shader_error) -> 422;
status(bad_kernel) -> 422;
status(dispatch_too_large) -> 422;
status(overloaded) -> 503;
status(port_unavailable) -> 503;
status(timeout) -> 504;
status(Reason) ->
    %% Every gateway failed to prove the kernel: the fault is upstream.
    case lists:member(Reason, [id_mismatch, bad_signature, data_root_mismatch, size_mismatch,
                               header_unavailable, bad_header, pin_mismatch,
                               unsupported_signature_type, fetch_failed, unreachable,
                               http_error]) of
        true -> 502;
        false -> 500
    end.

to_text(Bin) when is_binary(Bin) -> Bin;
%% Depth-limited: a reason may carry a caller's whole input binary.
to_text(Term) -> iolist_to_binary(io_lib:format("~0P", [Term, 12])).

%%% HyperBEAM integration, optional outside a node

first_found(_Key, [], _Opts) -> not_found;
first_found(Key, [Msg | Rest], Opts) ->
    case get(Key, Msg, Opts) of
        not_found -> first_found(Key, Rest, Opts);
        Value -> Value
    end.

get(Key, Msg, Opts) when is_map(Msg) ->
    case has(hb_ao, get, 4) of
        true -> hb_ao:get(Key, Msg, not_found, Opts);
        false -> maps:get(Key, Msg, not_found)
    end;
get(_Key, _Msg, _Opts) -> not_found.

event(Topic, Term) ->
    case has(hb_event, log, 5) of
        true -> hb_event:log(Topic, Term, ?MODULE, ?FUNCTION_NAME, ?LINE);
        false -> logger:debug("~p: ~p", [Topic, Term])
    end.

has(M, F, A) ->
    _ = code:ensure_loaded(M),
    erlang:function_exported(M, F, A).

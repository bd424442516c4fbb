%%% @doc The `kem@1.0' HyperBEAM device: WGSL compute kernels, named by
%%% Arweave ID, run on the node's GPU through the `kem' application.
%%%
%%% Keys (all `(Msg1, Msg2, Opts)'):
%%% - `execute_kernel': `kernel-id', `input-data', `output-size-hint'
%%%   (default 1);
%%% - `execute_kernel_with_params': the same plus `params' (u32 values,
%%%   packed as 32-bit little-endian words);
%%% - both take `grid', `workgroups' and `constants' too (dev_kem_opts):
%%%   a call with any of them is kem:execute/3's with those options;
%%%   and `gas-limit' (digits), the call's gas budget (docs/metering.md):
%%%   402 `gas_exhausted' when the kernel needs more;
%%% - `get_adapter_info': the adapter as JSON; `info': a description (JSON);
%%% - `run': a kernel by named buffers (dev_kem_run);
%%% - `dashboard', `dashboard_data': the operators' page and its JSON (kem_dashboard);
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
%%% `kem-usage-*' keys, `kem-usage-gas' among them (docs/metering.md). A failure carries `status', `error' and `reason' as
%%% top-level keys (HTTP headers: kem's own short ASCII, never a detail,
%%% which may quote a stranger's kernel; kem_reply) and those with
%%% `details' as a JSON body: a bad request is a 4xx naming the problem, a
%%% failure to run a 5xx. Nothing in a reply names a node path.
-module(dev_kem).

-export([info/1, info/3, execute_kernel/3, execute_kernel_with_params/3,
         get_adapter_info/3, execute_chain/3, run/3, dashboard/3, dashboard_data/3]).
-export([duplicate_key/1, string_input/0, field/3]).  % for dev_kem_chain and dev_kem_run

-define(FIELDS, [kernel_id, input_data, output_size_hint, params, grid, workgroups, constants, gas_limit]).
-define(DISPATCH_FIELDS, [grid, workgroups, constants]).

%% @doc Only these keys are reachable through the device.
-spec info(term()) -> map().
info(_) ->
    #{exports => [info, execute_kernel, execute_kernel_with_params, get_adapter_info, execute_chain, run,
                  dashboard, dashboard_data]}.

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
            <<"execute_kernel_with_params">> => <<"POST as execute_kernel, with params [u32]; both take grid or "
                                                   "workgroups X,Y,Z and constants NAME=Number, ...">>,
            <<"get_adapter_info">> => <<"GPU adapter and limits as JSON">>,
            <<"execute_chain">> => <<"POST JSON {input-data, steps: [{kernel-id, params, buffers, outputs, constants, "
                                      "grid, ...}]} or a message of those: one GPU submission; named results as run's">>,
            <<"run">> => <<"POST kernel-id, buffers/NAME parts (bytes), outputs/NAME (sizes), workgroups X,Y,Z: "
                           "every output and in/out buffer as buffers/NAME/body">>,
            <<"dashboard">> => <<"GET: the operators' page (HTML), refreshing from dashboard_data">>,
            <<"dashboard_data">> => <<"GET: the dashboard's figures as JSON">>}}).

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
           catch throw:{bad_request, _, Refused, Why} -> {bad_request, Refused, Why}
           end,
    case dev_kem_chain:request(Body, Opts) of
        {ok, Steps, ChainOpts} ->
            case kem:request_chain_usage(Steps, ChainOpts) of
                {{ok, Result}, Usage} ->
                    dev_kem_chain:reply(Result, Usage, Steps, Opts);
                {{error, Reason}, _Usage} ->
                    event(kem, {failed, execute_chain, Reason}),
                    failure(<<"Failed to execute chain">>, dev_kem_chain:flat_reason(Reason))
            end;
        {bad_request, Reason, Detail} ->  % 413 for too_large (a step's 65th buffer), else 400
            error_reply(kem_reply:status(Reason), <<"Bad request">>, Reason, Detail)
    end.

%% @doc A kernel called by named buffers (dev_kem_run; docs/hyperbeam.md).
-spec run(map(), map(), map()) -> {ok, map()} | {error, map()}.
run(Msg1, Msg2, Opts) ->
    event(kem, {request, run}),
    dev_kem_run:run(Msg1, Msg2, Opts).

%% @doc The operators' page (kem_dashboard, docs/dashboard.md).
-spec dashboard(map(), map(), map()) -> {ok, map()} | {error, map()}.
dashboard(_Msg1, _Msg2, _Opts) ->
    case kem_dashboard:http_page() of
        {ok, Reply} -> {ok, Reply};
        %% The page missing from priv is the node's fault, not the client's: 500.
        {error, {Reason, Detail}} -> error_reply(500, <<"Failed to make the dashboard">>, Reason, Detail)
    end.

%% @doc The dashboard's figures, polled by the page every 2 s.
-spec dashboard_data(map(), map(), map()) -> {ok, map()}.
dashboard_data(_Msg1, _Msg2, _Opts) ->
    json_reply(200, kem_dashboard:data()).

%% A JSON body is marked as such: a string in it is text, never bytes.
chain_body(Body) when is_binary(Body), Body =/= <<>> -> {json, json_object(Body)};
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
        args(Key, Fields, Opts)
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
                false -> json_fields(canonical(json_object(Body)))
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
        {error, {duplicate_key, Key}} -> bad(400, bad_args, duplicate_key(Key));
        {error, Detail} -> bad(Detail)
    end.

%% @doc The refusal of a JSON object with Key twice (kem_json), for
%% dev_kem_chain too; the key cut to 64 bytes.
-spec duplicate_key(binary()) -> binary().
duplicate_key(Key) ->
    Shown = case byte_size(Key) > 64 of true -> binary:part(Key, 0, 64); false -> Key end,
    <<"the JSON key \"", Shown/binary, "\" is given twice: which one counts is not guessed">>.

%% @doc The answer to `input-data' as a JSON string (docs/hyperbeam.md):
%% a string is text, and guessing base64 or hex would turn a mistake into
%% a run on the wrong bytes.
-spec string_input() -> binary().
string_input() ->
    <<"input-data in a JSON body must be an array of integers 0-255, not a string; to send raw bytes, "
      "make them the body with content-type: application/octet-stream">>.

json_fields(#{input_data := Text}) when is_binary(Text) -> bad(400, bad_args, string_input());
json_fields(Fields) -> Fields.

%% The fields given as message keys, kebab-case first.
key_fields(Msgs, Opts) ->
    maps:from_list([{F, V} || F <- ?FIELDS,
                              V <- [first_found(names(F), Msgs, Opts)], V =/= not_found]).

%% One field under both its names (kernel-id and kernel_id) is refused as
%% a duplicate key is.
canonical(Map) ->
    [bad(400, bad_args, <<"give ", A/binary, " or ", B/binary, ", not both">>)
     || F <- ?FIELDS, [A, B] <- [[N || N <- names(F), maps:is_key(N, Map)]]],
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

%% ASCII case only: string:lowercase/1 raises on a header that is not
%% UTF-8 (HTTP allows any byte 0x80-0xFF in a value).
is_octet_stream(<<Type:24/binary, _/binary>>) ->
    << <<(ascii_lower(C))>> || <<C>> <= Type >> =:= <<"application/octet-stream">>;
is_octet_stream(_) -> false.

ascii_lower(C) when C >= $A, C =< $Z -> C + 32;
ascii_lower(C) -> C.

%% A header's integer: ASCII blanks around digits. Not string:trim/1, which
%% raises `{badarg, _}' (not caught as `badarg') on bytes that are not UTF-8.
-spec header_integer(binary()) -> integer().
header_integer(Bin) ->
    binary_to_integer(trim_blanks(Bin)).

trim_blanks(<<C, Rest/binary>>) when C =:= $\s; C =:= $\t -> trim_blanks(Rest);
trim_blanks(Bin) ->
    Size = byte_size(Bin) - 1,
    case Bin of
        <<Head:Size/binary, C>> when C =:= $\s; C =:= $\t -> trim_blanks(Head);
        _ -> Bin
    end.

args(Key, Fields, Opts) ->
    KernelId = kernel_id(maps:get(kernel_id, Fields, missing)),
    Input = input_data(maps:get(input_data, Fields, missing)),
    {Method, Third, OutBytes} = case Key of
        execute_kernel ->
            Hint = hint(maps:get(output_size_hint, Fields, 1)),
            {Key, Hint, byte_size(Input) * Hint};
        execute_kernel_with_params ->
            Params = params(maps:get(params, Fields, missing)),
            ok = not_an_image_file(Input),
            {Key, Params, byte_size(Input)}
    end,
    case gas_limit(Fields, dispatch_opts(Fields, Opts, byte_size(Input), OutBytes)) of
        none -> {ok, Method, {KernelId, Input, Third}};
        Extra when Method =:= execute_kernel -> {ok, execute, {KernelId, Input, Extra#{output_size_hint => Third}}};
        Extra -> {ok, execute, {KernelId, Input, Extra#{params => Third}}}
    end.

%% grid, workgroups and constants (dev_kem_opts; docs/hyperbeam.md): a
%% call that gives any of them is kem:execute/3's, with those options;
%% one that gives none stays the kem@1.0 call it always was.
dispatch_opts(Fields, Opts, InBytes, OutBytes) ->
    case maps:with(?DISPATCH_FIELDS, Fields) of
        Given when map_size(Given) =:= 0 -> none;
        Given ->
            Checked = case dev_kem_opts:dispatch(Given, Opts, #{}) of
                          {ok, Map} -> Map;
                          {error, Detail} -> bad(400, bad_args, Detail)
                      end,
            case dev_kem_opts:bound(Checked, InBytes, OutBytes) of
                ok -> Checked;
                {error, Why} -> bad(400, bad_args, Why)
            end
    end.

%% `gas-limit' joins the call's options: an integer 1..2^63-1 (kem_args'
%% bound) or its digits, at most 64 bytes of them parsed.
gas_limit(#{gas_limit := V}, Extra) ->
    case gas_value(V) of
        N when is_integer(N), N >= 1, N < 1 bsl 63 -> (case Extra of none -> #{}; Map -> Map end)#{gas_limit => N};
        _ -> bad(400, bad_args, <<"gas-limit must be an integer 1..2^63-1 (docs/metering.md)">>)
    end;
gas_limit(_Fields, Extra) -> Extra.

gas_value(Bin) when is_binary(Bin), byte_size(Bin) =< 64 -> try header_integer(Bin) catch error:badarg -> bad end;
gas_value(V) -> V.

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
    try header_integer(Bin) of
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
    try [header_integer(P) || P <- binary:split(Bin, <<",">>, [global])] of
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

%%% replies (kem_reply: nothing untrusted at the top level)

success(Result, Usage, Opts) -> kem_reply:success(Result, Usage, Opts).

failure(Message, Reason) -> kem_reply:failure(Message, Reason).

error_reply(Status, Message, Reason, Detail) -> kem_reply:error(Status, Message, Reason, Detail).

json_reply(Status, Map) -> kem_reply:json(Status, Map).

%%% HyperBEAM integration, optional outside a node

first_found(_Names, [], _Opts) -> not_found;
first_found(Names, [Msg | Rest], Opts) ->
    case get_any(Names, Msg, Opts) of
        not_found -> first_found(Names, Rest, Opts);
        Value -> Value
    end.

get_any([], _Msg, _Opts) -> not_found;
get_any([Name | Rest], Msg, Opts) ->
    case field(Name, Msg, Opts) of
        not_found -> get_any(Rest, Msg, Opts);
        Value -> Value
    end.

%% @doc A plain field read: inside a node `hb_maps:get/4' (it loads links
%% but never dispatches to the message's device, which would be kem@1.0
%% itself), else `maps:get/3'; `not_found' when absent.
-spec field(term(), term(), map()) -> term().
field(Key, Msg, Opts) when is_map(Msg) ->
    case kem_optional:has(hb_maps, get, 4) of
        true -> hb_maps:get(Key, Msg, not_found, Opts);
        false -> maps:get(Key, Msg, not_found)
    end;
field(_Key, _Msg, _Opts) -> not_found.

event(Topic, Term) ->
    case kem_optional:has(hb_event, log, 5) of
        true -> hb_event:log(Topic, Term, ?MODULE, ?FUNCTION_NAME, ?LINE);
        false -> logger:debug("~p: ~p", [Topic, Term])
    end.

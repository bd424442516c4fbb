%%% @doc The `run' key of `dev_kem': a kernel called by named buffers
%%% (kem:run/3, issue 25; docs/hyperbeam.md, "run").
%%%
%%% Request, as message keys (HTTP: headers and multipart parts; Lua: a
%%% table), kebab-case or snake_case:
%%% - `kernel-id';
%%% - `buffers': a nested message, WGSL name (or `G/B', or a binding
%%%   number) to its bytes: every `var<storage, read>' and `var<uniform>'
%%%   and each `read_write' buffer used in place. A value is a binary, or a
%%%   message whose `body' is the binary (a multipart part with its own
%%%   headers arrives so); never an array of numbers;
%%% - `outputs': a nested message, name to size in bytes, as an integer or
%%%   decimal digits (HyperBEAM delivers both);
%%% - `workgroups' or `grid' (invocations): `[X, Y, Z]', `"X,Y,Z"' or a
%%%   message `{1: X, 2: Y, 3: Z}' (a list after HyperBEAM's
%%%   normalisation); one of them is required;
%%% - `constants': the kernel's overrides, name => number (dev_kem_opts);
%%% - `entry-point' (default `main');
%%% - `gas-limit': the call's gas budget, an integer or decimal digits,
%%%   1..2^63-1 (docs/metering.md); past it, 402 `gas_exhausted'.
%%%
%%% Reply: 200 with the `kem-usage-*' keys and `buffers', a nested message
%%% of every output and in/out buffer, each `#{<<"body">> => Bytes}'. Not
%%% the bytes as plain values: HyperBEAM's httpsig codec writes a binary of
%%% at most 4,096 bytes as a header, at the top level or inside a part,
%%% and a kernel's output is a stranger's bytes (CR, LF, `Set-Cookie:');
%%% a `body' is always a part's body, after its headers. Failures are
%%% dev_kem's (kem_reply).
-module(dev_kem_run).
-export([run/3]).
-export([named/3, named_reply/4]).  % for dev_kem_chain: a chain step's buffers and outputs, named results

%% The port's own bound (wire/run_requests.py MAX_BUFFERS), checked here
%% before a value is read.
-define(MAX_BUFFERS, 64).
%% A size in decimal digits: 20 digits hold any 64-bit size; a longer
%% string is not parsed (binary_to_integer/1 of a megabyte of digits is
%% seconds of the node's CPU).
-define(MAX_DIGITS, 20).
-define(MAX_NAME_SHOWN, 64).
-define(FIELDS, [kernel_id, buffers, outputs, workgroups, grid, constants, entry_point, gas_limit]).

%% @doc `dev_kem:run/3'.
-spec run(map(), map(), map()) -> {ok, map()} | {error, map()}.
run(Msg1, Msg2, Opts) ->
    try request([Msg2, Msg1], Opts) of
        {KernelId, Buffers, RunOpts} -> call(KernelId, Buffers, RunOpts, Opts)
    catch
        throw:{refused, Status, Reason, Detail} ->
            kem_reply:error(Status, <<"Bad request">>, Reason, Detail)
    end.

%%% the call

%% kem:run/3's road (kem:call_usage/3: checks, quarantine, placement,
%% timeout, metrics), taken directly for its usage record; the bytes are
%% counted here, where the buffers are known.
call(KernelId, Buffers, RunOpts, Opts) ->
    case kem:call_usage(run, {KernelId, Buffers, RunOpts}, kem:default_timeout()) of
        {{ok, Returned}, Usage} when is_map(Returned) ->
            Counted = Usage#{kernel_id => KernelId, bytes_in => total(Buffers), bytes_out => total(Returned)},
            named_reply(Returned, Counted, Opts, <<"Failed to run kernel">>);
        {{error, Reason}, _Usage} ->
            kem_reply:failure(<<"Failed to run kernel">>, Reason)
    end.

%% @doc The 200 of named results (`run''s, and a chain's whose last step
%% binds by name): the usage keys and `buffers', each `#{<<"body">> =>
%% Bytes}'; Message is the failure's should a name not be a WGSL identifier.
-spec named_reply(#{term() => binary()}, kem:usage(), map(), binary()) -> {ok, map()} | {error, map()}.
named_reply(Returned, Usage, Opts, Message) ->
    case reply_buffers(Returned) of
        {ok, Nested} ->
            {ok, Base} = kem_reply:success(<<>>, Usage, Opts),
            {ok, (maps:without([<<"body">>, <<"content-type">>], Base))#{<<"buffers">> => Nested}};
        Error ->
            kem_reply:failure(Message, Error)
    end.

%% @doc A `buffers' or `outputs' value read as `run' reads it (dev_kem_chain
%% reads a chain step's with it: one way to learn): name => bytes, name =>
%% size; or the refusal's status, reason and detail (the detail names the
%% field or the buffer).
-spec named(buffers | outputs, term(), map()) -> {ok, map()} | {error, {400..499, atom(), binary()}}.
named(Field, Value, Opts) ->
    try {ok, case Field of buffers -> buffers(Value, Opts); outputs -> outputs(Value, Opts) end}
    catch throw:{refused, Status, Reason, Detail} -> {error, {Status, Reason, Detail}}
    end.

%% Each returned name is a nested key (a part's name over HTTP): only the
%% port's WGSL identifiers, never a byte that could end a header line or
%% a quoted part name, nor `/' (a deeper path to HyperBEAM).
reply_buffers(Returned) ->
    case [N || N <- maps:keys(Returned), not plain_name(N)] of
        [] -> {ok, maps:map(fun(_Name, Bytes) -> #{<<"body">> => Bytes} end, Returned)};
        [_ | _] -> {bad_reply, <<"the port returned a buffer name that is not a WGSL identifier">>}
    end.

plain_name(N) when is_binary(N), byte_size(N) > 0, byte_size(N) =< 128 ->
    re:run(N, <<"^[A-Za-z_][A-Za-z0-9_]*$">>, [{capture, none}, dollar_endonly]) =:= match;  % $ alone took <<"c2\n">>
plain_name(_) -> false.

total(Map) -> lists:sum([byte_size(B) || B <- maps:values(Map), is_binary(B)]).

%%% the request

request(Msgs, Opts) ->
    Fields = fields(Msgs, Opts),
    KernelId = kernel_id(maps:get(kernel_id, Fields, missing)),
    Buffers = buffers(maps:get(buffers, Fields, #{}), Opts),
    Outputs = outputs(maps:get(outputs, Fields, #{}), Opts),
    Dispatch = dispatch(maps:with([grid, workgroups, constants], Fields), Opts),
    budget(Buffers, Outputs, Dispatch),
    Entry = case maps:get(entry_point, Fields, missing) of
                missing -> #{};
                E when is_binary(E), E =/= <<>> -> #{entry_point => E};
                _ -> refuse(<<"entry-point must be a non-empty string">>)
            end,
    Gas = gas_limit(maps:get(gas_limit, Fields, missing)),
    {KernelId, Buffers, maps:merge(maps:merge(Entry, Gas), Dispatch#{outputs => Outputs})}.

%% The budget as kem:run/3 takes it; digits as a header or part gives them.
gas_limit(missing) -> #{};
gas_limit(Bin) when is_binary(Bin) ->
    case decimal(Bin) of
        {ok, N} -> gas_limit(N);
        error -> gas_limit(bad)
    end;
gas_limit(N) when is_integer(N), N >= 1, N < 1 bsl 63 -> #{gas_limit => N};
gas_limit(_) -> refuse(400, bad_args, <<"gas-limit must be an integer 1..2^63-1 (docs/metering.md)">>).

%% Each field from the first message that has it (Msg2, then Msg1, as
%% dev_kem reads); one message giving both names of a field is refused.
fields(Msgs, Opts) ->
    maps:from_list([{F, V} || F <- ?FIELDS, V <- [first(names(F), Msgs, Opts)], V =/= not_found]).

first(_Names, [], _Opts) -> not_found;
first(Names, [Msg | Rest], Opts) ->
    case [V || N <- Names, V <- [dev_kem:field(N, Msg, Opts)], V =/= not_found] of
        [] -> first(Names, Rest, Opts);
        [V] -> V;
        [_, _] -> refuse(400, bad_args, <<"give ", (hd(Names))/binary, " or ", (lists:last(Names))/binary,
                                          ", not both">>)
    end.

names(Field) ->
    Snake = atom_to_binary(Field, utf8),
    lists:usort([Snake, binary:replace(Snake, <<"_">>, <<"-">>, [global])]).

kernel_id(Id) when is_binary(Id), Id =/= <<>> -> Id;
kernel_id(missing) -> refuse(<<"kernel-id is required">>);
kernel_id(_) -> refuse(<<"kernel-id must be a non-empty string">>).

%% Name => bytes. Over HTTP a part `buffers/0/1' nests as #{<<"0">> =>
%% #{<<"1">> => Bytes}}: a group's message is read back as `G/B' names.
buffers(Map, Opts) when is_map(Map) ->
    count(Map, <<"buffers">>),
    count(once(<<"buffer">>, lists:append([buffer(K, dev_kem:field(K, Map, Opts), Opts) || K <- maps:keys(Map)])), <<"buffers">>);
buffers(_, _) -> refuse(<<"buffers must be a message: name => bytes (multipart parts buffers/NAME)">>).

buffer(Name, Bytes, _Opts) when is_binary(Bytes) -> [{Name, Bytes}];
buffer(Name, #{<<"body">> := Bytes}, _Opts) when is_binary(Bytes) -> [{Name, Bytes}];
buffer(Group, Map, Opts) when is_map(Map), map_size(Map) > 0 ->
    case group(Group) of
        true -> [{slot(Group, B), bytes(slot(Group, B), dev_kem:field(B, Map, Opts))} || B <- maps:keys(Map)];
        false -> refuse(<<"buffer '", (shown(Group))/binary, "' must be bytes, not a message">>)
    end;
buffer(Name, _, _) ->
    refuse(<<"buffer '", (shown(Name))/binary, "' must be bytes (a binary value or part), not numbers">>).

%% The flattened pairs as a map, each slot once: `G/B' given as a name and
%% inside its group's message (a part `buffers/0/1' arrives nested) is
%% one slot of two values, and maps:from_list kept one of them silently
%% (red team: the other caller's bytes went unread). The port refuses a
%% name given twice; so does this.
once(What, Pairs) ->
    Map = maps:from_list(Pairs),
    case map_size(Map) =:= length(Pairs) of
        true -> Map;
        false -> refuse(400, bad_args, <<What/binary, " '", (shown(twice(Pairs, #{})))/binary,
                                        "' given twice (as G/B and inside its group's message)">>)
    end.

twice([{Name, _} | Rest], Seen) ->
    case maps:is_key(Name, Seen) of
        true -> Name;
        false -> twice(Rest, Seen#{Name => true})
    end.

bytes(_Slot, Bytes) when is_binary(Bytes) -> Bytes;
bytes(_Slot, #{<<"body">> := Bytes}) when is_binary(Bytes) -> Bytes;
bytes(Slot, _) -> refuse(<<"buffer '", (shown(Slot))/binary, "' must be bytes">>).

%% Name => size in bytes: an integer, or decimal digits (a header's or a
%% part's value).
outputs(Map, Opts) when is_map(Map) ->
    count(Map, <<"outputs">>),
    count(once(<<"output">>, lists:append([output(K, dev_kem:field(K, Map, Opts), Opts) || K <- maps:keys(Map)])), <<"outputs">>);
outputs(_, _) -> refuse(<<"outputs must be a message: name => size in bytes">>).

output(Group, Map, Opts) when is_map(Map), map_size(Map) > 0 ->
    case group(Group) of
        true -> [{slot(Group, B), size(slot(Group, B), dev_kem:field(B, Map, Opts))} || B <- maps:keys(Map)];
        false -> [{Group, size(Group, Map)}]
    end;
output(Name, Size, _Opts) -> [{Name, size(Name, Size)}].

size(_Name, N) when is_integer(N), N >= 0 -> N;
size(Name, Bin) when is_binary(Bin) ->
    case decimal(Bin) of
        {ok, N} -> N;
        error -> size(Name, bad)
    end;
size(Name, _) ->
    refuse(<<"output '", (shown(Name))/binary, "': its size must be an integer >= 0 (bytes), "
             "as a number or decimal digits">>).

%% A bind group's message over HTTP: its key a group number 0-3 (WebGPU's
%% four), its keys binding numbers. Binary keys only: HyperBEAM's keys are
%% binaries, and an integer key is kem:run/3's binding number of group 0.
group(G) -> lists:member(G, [<<"0">>, <<"1">>, <<"2">>, <<"3">>]).

slot(G, B) -> iolist_to_binary([name_text(G), "/", name_text(B)]).

name_text(N) when is_integer(N) -> integer_to_binary(N);
name_text(N) when is_atom(N) -> atom_to_binary(N, utf8);
name_text(N) when is_binary(N) -> N;
name_text(_) -> <<"?">>.

shown(Name) ->
    Text = name_text(Name),
    case byte_size(Text) > ?MAX_NAME_SHOWN of
        true -> binary:part(Text, 0, ?MAX_NAME_SHOWN);
        false -> Text
    end.

count(Map, What) when map_size(Map) > ?MAX_BUFFERS ->
    refuse(413, too_large, iolist_to_binary(io_lib:format("~b ~s: at most ~b", [map_size(Map), What, ?MAX_BUFFERS])));
count(Map, _What) -> Map.

%% grid or workgroups (one is required), constants (dev_kem_opts reads
%% each in every form HyperBEAM delivers it).
dispatch(Given, _Opts) when not is_map_key(grid, Given), not is_map_key(workgroups, Given) ->
    refuse(400, bad_args, <<"workgroups [X, Y, Z] or grid [X, Y, Z] (invocations) is required: kem's default "
                             "dispatch rules are for kem@1.0-shaped kernels">>);
dispatch(Given, Opts) ->
    case dev_kem_opts:dispatch(Given, Opts, #{}) of
        {ok, Checked} -> Checked;
        {error, Detail} -> refuse(Detail)
    end.

decimal(Bin) ->
    Digits = dev_kem_opts:trim(Bin),
    case byte_size(Digits) =< ?MAX_DIGITS andalso Digits =/= <<>>
         andalso lists:all(fun(C) -> C >= $0 andalso C =< $9 end, binary_to_list(Digits)) of
        true -> {ok, binary_to_integer(Digits)};
        false -> error
    end.

%% Before anything is framed or allocated, with request/2's budget
%% (`request_max_output_bytes', 16 MiB by default), as execute_chain: the
%% given bytes at most the budget, the outputs the port makes and zeroes
%% together at most the budget; and at most one workgroup per 4-byte
%% element of all the buffers together, what execute_kernel would
%% dispatch at @workgroup_size(1) (a stranger's [65535, 65535, 64] on 4
%% bytes held a port for a whole timeout, kem_isolation_tests).
budget(Buffers, Outputs, Dispatch) ->
    Budget = case application:get_env(kem, request_max_output_bytes, 16 bsl 20) of
                 N when is_integer(N), N >= 0 -> N;
                 _ -> 16 bsl 20
             end,
    In = total(Buffers),
    Out = lists:sum(maps:values(Outputs)),
    In =< Budget orelse refuse(413, too_large, over(<<"buffers">>, In, Budget)),
    Out =< Budget orelse refuse(413, too_large, over(<<"outputs">>, Out, Budget)),
    case dev_kem_opts:bound(Dispatch, In, Out) of
        ok -> ok;
        {error, Detail} -> refuse(400, bad_args, Detail)
    end.

over(What, Size, Budget) ->
    iolist_to_binary(io_lib:format("~s of ~b bytes are over this request's limit of ~b", [What, Size, Budget])).

-spec refuse(binary()) -> no_return().
refuse(Detail) -> refuse(400, bad_request, Detail).

-spec refuse(400..499, atom(), binary()) -> no_return().
refuse(Status, Reason, Detail) -> throw({refused, Status, Reason, Detail}).
